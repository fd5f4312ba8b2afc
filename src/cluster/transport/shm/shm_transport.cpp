#include "cluster/transport/shm/shm_transport.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "cluster/net/socket.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"
#include "util/fnv1a.hpp"
#include "util/log.hpp"
#include "util/spin.hpp"

namespace mirrored::detail::cluster {
namespace {

using Clock = WorkerTransport::Clock;

constexpr uint64_t kMagic = 0x6d6972726f726564ull;  // "mirrored"
constexpr std::size_t kControlBytes = 4096;
constexpr std::size_t kDefaultSlotBytes = std::size_t{8} << 20;
constexpr auto kWaitSlice = std::chrono::milliseconds(100);  // how often a waiter checks abort and peers

// The start of the segment. Atomics of the segment are shared between processes (lock-free).
struct Control {
  uint64_t magic;
  uint64_t job_hash;
  int64_t workers;
  uint64_t slot_bytes;
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  alignas(64) std::atomic<uint32_t> aborted;
};
static_assert(sizeof(Control) <= kControlBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is shared with other processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// The start time of a process (field 22 of /proc/<pid>/stat): with the pid, it identifies the
// process even after its pid is reused.
std::string start_time(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  const auto close = text.rfind(')');
  if (close == std::string::npos) return "";
  std::size_t field = 2, at = close + 1;
  while (field < 21 && at < text.size()) {  // at: the space before field `field + 1`
    at = text.find(' ', at + 1);
    if (at == std::string::npos) return "";
    ++field;
  }
  const auto end = text.find(' ', at + 1);
  return text.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}

class ShmTransport : public WorkerTransport {
 public:
  ShmTransport(void* base, std::size_t bytes, int rank, int workers, std::vector<long> pids,
               std::vector<std::string> start_times, std::vector<std::string> names)
      : base_(base),
        bytes_(bytes),
        rank_(rank),
        workers_(workers),
        pids_(std::move(pids)),
        start_times_(std::move(start_times)),
        names_(std::move(names)) {
    ctl_ = static_cast<Control*>(base_);
    slot_bytes_ = static_cast<std::size_t>(ctl_->slot_bytes);
  }
  ~ShmTransport() override { ::munmap(base_, bytes_); }

  std::string name() const override { return "shared memory"; }

  void all_reduce_sum(DType dtype, const void* in, void* out, int64_t count, Clock::time_point deadline) override {
    reduce_through_slots(dtype, dtype, in, out, count, deadline);
  }

  void all_reduce_half(DType dtype, DType half, const void* in, void* out, int64_t count,
                       Clock::time_point deadline) override {
    reduce_through_slots(dtype, half, in, out, count, deadline);
  }

  void all_gather(const void* in, void* out, const std::vector<std::size_t>& sizes,
                  Clock::time_point deadline) override {
    check();
    std::size_t largest = 0;
    for (auto s : sizes) largest = std::max(largest, s);
    std::vector<std::size_t> offsets(sizes.size(), 0);
    for (std::size_t w = 1; w < sizes.size(); ++w) offsets[w] = offsets[w - 1] + sizes[w - 1];
    const std::size_t mine = sizes[static_cast<std::size_t>(rank_)];
    for (std::size_t at = 0; at < largest; at += slot_bytes_) {
      if (at < mine)
        std::memcpy(slot(rank_), static_cast<const unsigned char*>(in) + at, std::min(slot_bytes_, mine - at));
      barrier(deadline);
      for (int w = 0; w < workers_; ++w) {
        const std::size_t size = sizes[static_cast<std::size_t>(w)];
        if (at < size) {
          std::memcpy(static_cast<unsigned char*>(out) + offsets[static_cast<std::size_t>(w)] + at, slot(w),
                      std::min(slot_bytes_, size - at));
        }
      }
      barrier(deadline);
    }
  }

  void broadcast(void* buf, std::size_t bytes, Clock::time_point deadline) override {
    check();
    for (std::size_t at = 0; at < bytes; at += slot_bytes_) {
      const std::size_t len = std::min(slot_bytes_, bytes - at);
      if (rank_ == 0) std::memcpy(slot(0), static_cast<unsigned char*>(buf) + at, len);
      barrier(deadline);
      if (rank_ != 0) std::memcpy(static_cast<unsigned char*>(buf) + at, slot(0), len);
      barrier(deadline);
    }
  }

  void interrupt() noexcept override {
    interrupted_.store(true);
    // Every worker's waits end: a job that failed is torn down everywhere.
    ctl_->aborted.store(1, std::memory_order_release);
    ctl_->generation.fetch_add(0x10000u, std::memory_order_acq_rel);  // no barrier completes as usual
    futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
  }

 private:
  unsigned char* slot(int w) const {
    return static_cast<unsigned char*>(base_) + kControlBytes + static_cast<std::size_t>(w) * slot_bytes_;
  }
  unsigned char* result(int64_t k) const { return slot(workers_ + static_cast<int>(k)); }

  // The all-reduces: `in` goes into this worker's slot as `wire` elements (the host backend's
  // cast rounds it when `wire` is a half type), each worker sums its slice of every slot in worker
  // order (sum_n adds halves in float and rounds once), and the result comes out as `dtype`.
  void reduce_through_slots(DType dtype, DType wire, const void* in, void* out, int64_t count,
                            Clock::time_point deadline) {
    check();
    const std::size_t elem = dtype_size(dtype);
    const std::size_t wire_elem = dtype_size(wire);
    const auto per_chunk = static_cast<int64_t>(slot_bytes_ / wire_elem);
    const int64_t align = std::max<int64_t>(1, static_cast<int64_t>(64 / wire_elem));
    auto& host = backend_for(cpu0);
    auto convert = [&](DType from, const void* src, DType to, void* dst, int64_t n) {
      if (from == to)
        std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(to));
      else
        host.cast(from, src, to, dst, n);
    };
    std::vector<const void*> parts(static_cast<std::size_t>(workers_));
    int64_t chunk_index = 0;
    for (int64_t begin = 0; begin < count; begin += per_chunk, ++chunk_index) {
      const int64_t len = std::min(per_chunk, count - begin);
      unsigned char* result = this->result(chunk_index % 2);
      convert(dtype, static_cast<const unsigned char*>(in) + static_cast<std::size_t>(begin) * elem, wire, slot(rank_),
              len);
      barrier(deadline);
      // This worker's slice, whole cache lines; summed over the slots in worker order.
      const int64_t per = ((len + workers_ - 1) / workers_ + align - 1) / align * align;
      const int64_t lo = std::min(len, per * rank_);
      const int64_t hi = std::min(len, lo + per);
      if (hi > lo) {
        for (int w = 0; w < workers_; ++w)
          parts[static_cast<std::size_t>(w)] = slot(w) + static_cast<std::size_t>(lo) * wire_elem;
        host.sum_n(wire, parts.data(), workers_, result + static_cast<std::size_t>(lo) * wire_elem, hi - lo);
      }
      barrier(deadline);
      // Results alternate between two areas, so that the next chunk's sums never overwrite a
      // result a slower worker is still copying out.
      convert(wire, result, dtype, static_cast<unsigned char*>(out) + static_cast<std::size_t>(begin) * elem, len);
    }
  }

  void check() const {
    if (interrupted_.load() || ctl_->aborted.load(std::memory_order_acquire))
      throw TransportError{false, "the shared-memory transport was shut down after a failure"};
  }

  // A peer whose process has exited (or was replaced by another with its pid).
  void check_peers() const {
    for (int w = 0; w < workers_; ++w) {
      if (w == rank_ || pids_[static_cast<std::size_t>(w)] <= 0) continue;
      const long pid = pids_[static_cast<std::size_t>(w)];
      const bool gone = (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ||
                        (!start_times_[static_cast<std::size_t>(w)].empty() &&
                         start_time(pid) != start_times_[static_cast<std::size_t>(w)]);
      if (gone) {
        throw TransportError{false, str_cat(names_[static_cast<std::size_t>(w)], " is gone: its process (pid ", pid,
                                            ") exited during a shared-memory collective")};
      }
    }
  }

  void barrier(Clock::time_point deadline) {
    const uint32_t gen = ctl_->generation.load(std::memory_order_acquire);
    if (ctl_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(workers_)) {
      ctl_->arrived.store(0, std::memory_order_relaxed);
      ctl_->generation.fetch_add(1, std::memory_order_acq_rel);
      futex(&ctl_->generation, FUTEX_WAKE, INT_MAX, nullptr);
      check();
      return;
    }
    auto passed = [&] { return ctl_->generation.load(std::memory_order_acquire) != gen; };
    if (!spin_until(passed)) {
      while (!passed()) {
        check();
        check_peers();
        const auto now = Clock::now();
        if (now >= deadline)
          throw TransportError{true, "timed out at a shared-memory barrier waiting for the other workers"};
        const auto wait = std::min<Clock::duration>(kWaitSlice, deadline - now);
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
        timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        futex(&ctl_->generation, FUTEX_WAIT, gen, &ts);
      }
    }
    check();
  }

  void* base_;
  std::size_t bytes_;
  int rank_;
  int workers_;
  std::vector<long> pids_;
  std::vector<std::string> start_times_;
  std::vector<std::string> names_;
  Control* ctl_;
  std::size_t slot_bytes_;
  std::atomic<bool> interrupted_{false};
};

struct Mapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  void* release() { return std::exchange(base, MAP_FAILED); }
};

}  // namespace

bool shared_memory_disabled() {
  const char* v = std::getenv("MIRRORED_SHARED_MEMORY");
  if (!v) return false;
  const std::string s = v;
  return s == "0" || s == "off" || s == "OFF" || s == "false" || s == "no";
}

std::unique_ptr<WorkerTransport> make_shm_transport_if_same_host(const TransportJob& job, Clock::time_point deadline) {
  if (shared_memory_disabled()) return nullptr;
  const auto& infos = job.workers;
  for (const auto& w : infos) {
    if (w.shared_memory_domain().empty() || w.shared_memory_domain() != infos[0].shared_memory_domain())
      return nullptr;  // not all on this host (in this IPC namespace): every worker decides so
  }
  const int workers = job.num_workers();
  std::size_t slot_bytes = kDefaultSlotBytes;
  if (const char* v = std::getenv("MIRRORED_SHM_SLOT_KB")) {
    const long kb = std::strtol(v, nullptr, 10);
    if (kb >= 4 && kb <= (1l << 20)) slot_bytes = static_cast<std::size_t>(kb) << 10;
  }
  // Every worker's slot plus two result areas.
  const std::size_t bytes = kControlBytes + static_cast<std::size_t>(workers + 2) * slot_bytes;
  const std::string name = str_cat("/mirrored-", std::hex, fnv1a(job.prefix));
  const std::string key = job.prefix + "shm/";
  KeyValueStore& store = job.store;

  std::string problem;
  Mapping map;
  map.bytes = bytes;
  net::Fd fd;
  if (job.rank == 0) {
    fd.reset(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) {
      problem = str_cat("shm_open(", name, ") failed: ", std::strerror(errno),
                        errno == EEXIST ? " (left by an earlier attempt with the same job id and generation?)" : "");
    } else if (const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0) {
      problem = str_cat("cannot reserve ", bytes >> 20, " MiB of shared memory: ", std::strerror(err));
    }
  } else {
    const auto created = store.get(key + "created", net::seconds_until(deadline));
    if (!created || *created != "ok") {
      problem = created ? "the chief could not create the segment" : "the chief did not create the segment in time";
    } else {
      fd.reset(::shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0));
      struct stat st;
      if (!fd)
        problem = str_cat("shm_open(", name, ") failed: ", std::strerror(errno));
      else if (::fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes)
        problem = str_cat("the segment ", name, " has an unexpected size");
    }
  }
  if (problem.empty()) {
    map.base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (map.base == MAP_FAILED) problem = str_cat("mmap failed: ", std::strerror(errno));
  }
  if (job.rank == 0) {
    if (problem.empty()) {
      auto* ctl = new (map.base) Control{};
      ctl->magic = kMagic;
      ctl->job_hash = fnv1a(job.prefix);
      ctl->workers = workers;
      ctl->slot_bytes = slot_bytes;
    }
    store.set(key + "created", problem.empty() ? "ok" : "failed");
  } else if (problem.empty()) {
    const auto* ctl = static_cast<const Control*>(map.base);
    if (ctl->magic != kMagic || ctl->job_hash != fnv1a(job.prefix) || ctl->workers != workers ||
        ctl->slot_bytes != slot_bytes)
      problem = "the segment belongs to another job or configuration";
  }
  // Every worker reports; all use shared memory only if all of them mapped it.
  store.set(key + "attached/" + std::to_string(job.rank), problem.empty() ? "ok" : problem);
  std::vector<std::string> keys;
  for (int w = 0; w < workers; ++w) keys.push_back(key + "attached/" + std::to_string(w));
  const auto missing = store.wait(keys, net::seconds_until(deadline));
  if (job.rank == 0 && fd) ::shm_unlink(name.c_str());  // mapped everywhere (or abandoned): no name left behind
  MIRRORED_ENFORCE(missing.empty(), DeadlineExceededError,
                   "MultiWorkerMirroredStrategy: the workers did not finish "
                   "setting up shared memory before the start-up deadline");
  for (int w = 0; w < workers; ++w) {
    const auto v = store.get(keys[static_cast<std::size_t>(w)], 0);
    if (!v || *v != "ok") {
      MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: the workers run on one host but ",
                   job.names[static_cast<std::size_t>(w)], " cannot use shared memory (", v.value_or("?"),
                   "); using TCP instead");
      return nullptr;
    }
  }
  std::vector<long> pids;
  std::vector<std::string> starts;
  std::vector<std::string> names;
  const bool same_pid_ns = std::all_of(infos.begin(), infos.end(), [&](const WorkerInfo& w) {
    return !w.pid_namespace.empty() && w.pid_namespace == infos[0].pid_namespace;
  });
  for (int w = 0; w < workers; ++w) {
    const long pid = same_pid_ns ? infos[static_cast<std::size_t>(w)].pid : 0;
    pids.push_back(pid);
    starts.push_back(pid > 0 ? start_time(pid) : "");
    names.push_back(job.names[static_cast<std::size_t>(w)]);
  }
  return std::make_unique<ShmTransport>(map.release(), bytes, job.rank, workers, std::move(pids), std::move(starts),
                                        std::move(names));
}

}  // namespace mirrored::detail::cluster
