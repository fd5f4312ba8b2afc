// One worker of bench/bench_multi_worker.sh: times MultiWorkerMirroredStrategy all-reduces of
// float tensors (one CPU replica per worker), the way the PyTorch side times
// torch.distributed.all_reduce: after a warm-up and a barrier, the mean wall time of `iters`
// back-to-back all-reduces. The chief prints one line per size:
//
//   mirrored <label> <MiB> MiB <iters> iters: <ms> ms per all-reduce
//
//   bench_multi_worker [--label NAME] [--sizes 4,64] [--iters 50,10]
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace {

std::vector<int> ints(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mirrored;
  std::string label = "mirrored";
  std::vector<int> sizes{4, 64};
  std::vector<int> iters{50, 10};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--label") label = argv[i + 1];
    if (flag == "--sizes") sizes = ints(argv[i + 1]);
    if (flag == "--iters") iters = ints(argv[i + 1]);
  }
  try {
    MultiWorkerMirroredStrategy s(CommunicationOptions{}, nullptr, {"CPU:0"});
    const bool chief = s.extended().should_checkpoint();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = int64_t{sizes[k]} << 18;  // MiB of float32
      const int count = iters[std::min(k, iters.size() - 1)];
      const Tensor<float> x = Tensor<float>::full({n}, 1.0f);
      auto step = [&] { return get_replica_context()->all_reduce(ReduceOp::SUM, x); };
      for (int w = 0; w < 3; ++w) s.run(step);
      s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);  // start together
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i) s.run(step);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (chief) {
        std::printf("mirrored %s %d MiB %d iters: %.3f ms per all-reduce\n", label.c_str(), sizes[k], count,
                    ms / count);
        std::fflush(stdout);
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_multi_worker: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
