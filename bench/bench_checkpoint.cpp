// checkpoint::save_tensors and checkpoint::load of one float tensor of S bytes, reported as ratios
// to a plain write / read of the same bytes, measured in the same process on the same file system.
//
//   save:    checkpoint::save_tensors(path, {"w": x}): header, data with its CRC-32, fsync, rename
//            over the previous file, fsync of the directory.
//   write:   (anchor) the same file's bytes (taken from the saved file once) written to a second
//            path's temporary file in one buffer, fsync, rename over the previous file.
//   load:    checkpoint::load(path): header parsed and validated, data read into a fresh host
//            tensor with its CRC-32 checked; the result is dropped.
//   read:    (anchor) open the saved file, read all of it into a buffer allocated once, close.
//
// Save and write alternate within each benchmark iteration (order flipped every iteration), as do
// load and read, so both see the same page cache and disk state. Manual time = save (load). Counters:
//   save_ms, write_ms / load_ms, read_ms   mean wall time of one call of each
//   ratio        write_ms / save_ms (read_ms / load_ms): 1.0 = as fast as the plain I/O (target >= 0.8)
//   ratio_med    median over iterations of the paired ratio of the same iteration
//   save_GBps, write_GBps / load_GBps, read_GBps   file bytes per second
//   crc_GBps     (load) the checksum alone over the loaded bytes (best of 5 passes), for reference
//
// BM_ManagerSave/sync_directory:D: checkpoint::CheckpointManager::save of the digits model
// (examples/digits/mlp.hpp: w1 64x64, b1 64, w2 64x10, b2 10, float) with its Adam state (m and v of
// each, the step counter), one new step per call with max_to_keep 5 (so each save also deletes the
// oldest checkpoint), against the anchor `write` above of the same file's bytes. D: the option
// CheckpointManagerOptions::sync_directory (0, the default: one fsync per save, as the anchor;
// 1: a second one, of the directory). Counters: manager_ms, write_ms, ratio
// (write_ms / manager_ms, target >= 0.8), ratio_med, file_bytes.
//
// BM_Crc32/kernel:K/bytes:S: the CRC-32 kernels (src/util/crc32.hpp: 0 zlib, 1 pclmul, 2 vpclmul512;
// the label names it, a kernel this CPU lacks is skipped) over S bytes: 256 KiB is the piece that
// load checksums right after reading it (in cache), 64 MiB a buffer from memory. Counter: GBps.
//
// Files go to $MIRRORED_BENCH_DIR, else the system's temporary directory ($TMPDIR, else /tmp): put
// it on the file system whose speed matters (a tmpfs makes fsync free). See bench/README.md.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <mirrored/checkpoint.hpp>
#include <mirrored/checkpoint_manager.hpp>
#include <mirrored/optimizers.hpp>
#include <mirrored/tensor.hpp>
#include <mirrored/variable.hpp>

#include "util/crc32.hpp"

namespace {

using mirrored::Tensor;
using Clock = std::chrono::steady_clock;
namespace ckpt = mirrored::checkpoint;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error("bench_checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

/// A fresh directory for this process's files, removed at exit.
class BenchDir {
 public:
  BenchDir() {
    const char* env = std::getenv("MIRRORED_BENCH_DIR");
    const std::filesystem::path base =
        env && *env ? std::filesystem::path(env) : std::filesystem::temp_directory_path();
    dir_ = base / ("mirrored_bench_checkpoint." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~BenchDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

BenchDir& bench_dir() {
  static BenchDir dir;
  return dir;
}

std::vector<char> read_file(const std::string& path) {
  std::vector<char> bytes(std::filesystem::file_size(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("reading", path);
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

/// The anchor of save: write `bytes` to `<path>.tmp`, fsync, rename over `path`.
void plain_write(const std::string& path, const std::vector<char>& bytes) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating", temp);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", temp);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsyncing", temp);
  if (::close(fd) != 0) fail("closing", temp);
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("renaming", temp);
}

/// The anchor of load: read all of `path` into `buffer` (allocated once by the caller).
void plain_read(const std::string& path, std::vector<char>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("stat of", path);
  const auto size = static_cast<std::size_t>(st.st_size);
  if (buffer.size() < size) buffer.resize(size);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, buffer.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("reading", path);
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

/// One float tensor of `bytes` bytes with varied contents (so the checksum sees real data).
ckpt::TensorMap model_of(int64_t bytes) {
  Tensor<float> w = Tensor<float>::zeros({bytes / static_cast<int64_t>(sizeof(float))});
  float* p = w.data();
  for (int64_t i = 0; i < w.numel(); ++i) p[i] = static_cast<float>(i % 1000) * 0.25f;
  return {{"w", ckpt::untyped(w)}};
}

void BM_Save(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const ckpt::TensorMap model = model_of(bytes);
  const std::string path = bench_dir().file("save.safetensors");
  const std::string anchor_path = bench_dir().file("write.bin");
  ckpt::save_tensors(path, model);  // warm-up, and the bytes the anchor writes
  const std::vector<char> file_bytes = read_file(path);
  plain_write(anchor_path, file_bytes);

  double save_total = 0, write_total = 0;
  std::vector<double> paired;
  int64_t iters = 0;
  for (auto _ : state) {
    double t_save = 0, t_write = 0;
    for (int k = 0; k < 2; ++k) {
      const bool do_save = ((iters + k) % 2) == 0;
      const auto t0 = Clock::now();
      if (do_save) {
        ckpt::save_tensors(path, model);
        t_save = seconds(Clock::now() - t0);
      } else {
        plain_write(anchor_path, file_bytes);
        t_write = seconds(Clock::now() - t0);
      }
    }
    save_total += t_save;
    write_total += t_write;
    paired.push_back(t_write / t_save);
    state.SetIterationTime(t_save);
    ++iters;
  }
  if (iters == 0) return;
  const double n = static_cast<double>(iters);
  const double file_size = static_cast<double>(file_bytes.size());
  state.counters["save_ms"] = save_total / n * 1e3;
  state.counters["write_ms"] = write_total / n * 1e3;
  state.counters["ratio"] = write_total / save_total;
  state.counters["ratio_med"] = median(paired);
  state.counters["save_GBps"] = file_size * n / save_total * 1e-9;
  state.counters["write_GBps"] = file_size * n / write_total * 1e-9;
}

void BM_Load(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  const std::string path = bench_dir().file("load.safetensors");
  {
    const ckpt::TensorMap model = model_of(bytes);
    ckpt::save_tensors(path, model);
    // The check before timing: what load returns is what was saved.
    const ckpt::Checkpoint loaded = ckpt::load(path);
    const Tensor<float> w = loaded.get<float>("w");
    if (w.numel() != bytes / 4 || std::memcmp(w.data(), model.at("w").data(), static_cast<std::size_t>(bytes)) != 0)
      throw std::runtime_error("bench_checkpoint: load returned different data");
  }
  std::vector<char> buffer;
  plain_read(path, buffer);  // warm-up: the file is in the page cache for both from here on

  double load_total = 0, read_total = 0;
  std::vector<double> paired;
  int64_t iters = 0;
  for (auto _ : state) {
    double t_load = 0, t_read = 0;
    for (int k = 0; k < 2; ++k) {
      const bool do_load = ((iters + k) % 2) == 0;
      const auto t0 = Clock::now();
      if (do_load) {
        {
          const ckpt::Checkpoint c = ckpt::load(path);
          benchmark::DoNotOptimize(c.tensors().size());
        }
        t_load = seconds(Clock::now() - t0);
      } else {
        plain_read(path, buffer);
        benchmark::DoNotOptimize(buffer.data());
        t_read = seconds(Clock::now() - t0);
      }
    }
    load_total += t_load;
    read_total += t_read;
    paired.push_back(t_read / t_load);
    state.SetIterationTime(t_load);
    ++iters;
  }
  if (iters == 0) return;
  // The checksum alone, over the bytes just read (after the loop: it is not part of the ratio).
  double t_crc = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto c0 = Clock::now();
    benchmark::DoNotOptimize(mirrored::detail::checkpoint_crc32(0, buffer.data(), buffer.size()));
    const double t = seconds(Clock::now() - c0);
    t_crc = pass == 0 ? t : std::min(t_crc, t);
  }
  const double n = static_cast<double>(iters);
  const double file_size = static_cast<double>(std::filesystem::file_size(path));
  state.counters["load_ms"] = load_total / n * 1e3;
  state.counters["read_ms"] = read_total / n * 1e3;
  state.counters["ratio"] = read_total / load_total;
  state.counters["ratio_med"] = median(paired);
  state.counters["load_GBps"] = file_size * n / load_total * 1e-9;
  state.counters["read_GBps"] = file_size * n / read_total * 1e-9;
  state.counters["crc_GBps"] = file_size / t_crc * 1e-9;
}

void BM_ManagerSave(benchmark::State& state) {
  using mirrored::Variable;
  // The digits model and its Adam state after one update (plain variables: the default strategy).
  const std::vector<std::pair<std::string, mirrored::Shape>> shapes{
      {"dense_1/kernel", {64, 64}}, {"dense_1/bias", {64}}, {"dense_2/kernel", {64, 10}}, {"dense_2/bias", {10}}};
  std::vector<Variable<float>> vars;
  mirrored::optimizers::GradsAndVars<float> grads;
  for (const auto& [name, shape] : shapes) {
    Tensor<float> init = Tensor<float>::zeros(shape);
    for (int64_t i = 0; i < init.numel(); ++i) init.data()[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
    vars.emplace_back(init, mirrored::VariableOptions{.name = name});
    grads.emplace_back(init * 0.5f, vars.back());
  }
  mirrored::optimizers::Adam<float> adam;
  adam.apply_gradients(grads);
  const std::string dir = bench_dir().file("manager");
  std::filesystem::remove_all(dir);
  ckpt::CheckpointManager manager(mirrored::get_strategy(), dir, 5, {.sync_directory = state.range(0) != 0});
  for (std::size_t k = 0; k < vars.size(); ++k) manager.track(shapes[k].first, vars[k]);
  manager.track("adam", adam);
  int64_t step = 0;
  const std::string first = manager.save(step++);  // warm-up, and the bytes the anchor writes
  const std::vector<char> file_bytes = read_file(first);
  const std::string anchor_path = bench_dir().file("manager_write.bin");
  plain_write(anchor_path, file_bytes);

  double save_total = 0, write_total = 0;
  std::vector<double> paired;
  int64_t iters = 0;
  for (auto _ : state) {
    double t_save = 0, t_write = 0;
    for (int k = 0; k < 2; ++k) {
      const bool do_save = ((iters + k) % 2) == 0;
      const auto t0 = Clock::now();
      if (do_save) {
        benchmark::DoNotOptimize(manager.save(step++));
        t_save = seconds(Clock::now() - t0);
      } else {
        plain_write(anchor_path, file_bytes);
        t_write = seconds(Clock::now() - t0);
      }
    }
    save_total += t_save;
    write_total += t_write;
    paired.push_back(t_write / t_save);
    state.SetIterationTime(t_save);
    ++iters;
  }
  if (iters == 0) return;
  const double n = static_cast<double>(iters);
  state.counters["manager_ms"] = save_total / n * 1e3;
  state.counters["write_ms"] = write_total / n * 1e3;
  state.counters["ratio"] = write_total / save_total;
  state.counters["ratio_med"] = median(paired);
  state.counters["file_bytes"] = static_cast<double>(file_bytes.size());
}

void BM_Crc32(benchmark::State& state) {
  const auto kernel = static_cast<mirrored::detail::Crc32Kernel>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  state.SetLabel(mirrored::detail::crc32_kernel_name(kernel));
  if (!mirrored::detail::crc32_kernel_supported(kernel)) {
    state.SkipWithError("this CPU lacks the instructions of this kernel");
    return;
  }
  std::vector<unsigned char> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  std::uint32_t crc = 0;
  for (auto _ : state) {
    crc = mirrored::detail::crc32_update(kernel, crc, data.data(), data.size());
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["GBps"] =
      benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

constexpr int64_t kMiB = int64_t{1} << 20;

BENCHMARK(BM_Save)->ArgName("bytes")->Arg(64 * kMiB)->Arg(256 * kMiB)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load)->ArgName("bytes")->Arg(64 * kMiB)->Arg(256 * kMiB)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ManagerSave)->ArgName("sync_directory")->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Crc32)
    ->ArgNames({"kernel", "bytes"})
    ->ArgsProduct({{0, 1, 2}, {256 << 10, 64 * kMiB}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
