// One worker of bench/bench_multi_worker.sh: times MultiWorkerMirroredStrategy all-reduces of
// float tensors (one CPU replica per worker), the way the PyTorch side times
// torch.distributed.all_reduce: after a warm-up and a barrier, the mean wall time of `iters`
// back-to-back all-reduces, for each size and each CommunicationOptions::compression asked for
// (one after the other, with the same workers). The chief prints one line per size and
// compression (the label gets "-fp16" or "-bf16" appended for those):
//
//   mirrored <label> <MiB> MiB <iters> iters: <ms> ms per all-reduce
//
//   bench_multi_worker [--label NAME] [--sizes 4,64] [--iters 50,10] [--compressions none,fp16,bf16]
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace {

std::vector<std::string> items(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

std::vector<int> ints(const std::string& text) {
  std::vector<int> out;
  for (const auto& item : items(text)) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mirrored;
  std::string label = "mirrored";
  std::vector<int> sizes{4, 64};
  std::vector<int> iters{50, 10};
  std::vector<std::string> compressions{"none"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--label") label = argv[i + 1];
    if (flag == "--sizes") sizes = ints(argv[i + 1]);
    if (flag == "--iters") iters = ints(argv[i + 1]);
    if (flag == "--compressions") compressions = items(argv[i + 1]);
  }
  try {
    MultiWorkerMirroredStrategy s(CommunicationOptions{}, nullptr, {"CPU:0"});
    const bool chief = s.extended().should_checkpoint();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = int64_t{sizes[k]} << 18;  // MiB of float32
      const int count = iters[std::min(k, iters.size() - 1)];
      const Tensor<float> x = Tensor<float>::full({n}, 1.0f);
      for (const std::string& name : compressions) {
        CommunicationOptions options;
        options.compression = name == "fp16"   ? Compression::FP16
                              : name == "bf16" ? Compression::BF16
                                               : Compression::NONE;
        auto step = [&] { return get_replica_context()->all_reduce(ReduceOp::SUM, x, options); };
        for (int w = 0; w < 3; ++w) s.run(step);
        s.reduce(ReduceOp::SUM, s.run([] { return 1.0f; }), std::nullopt);  // start together
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < count; ++i) s.run(step);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (chief) {
          const std::string suffix = options.compression == Compression::NONE ? "" : "-" + name;
          std::printf("mirrored %s%s %d MiB %d iters: %.3f ms per all-reduce\n", label.c_str(), suffix.c_str(),
                      sizes[k], count, ms / count);
          std::fflush(stdout);
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_multi_worker: %s: %s\n", error_code_name(e.code()), e.what());
    return 1;
  }
  return 0;
}
