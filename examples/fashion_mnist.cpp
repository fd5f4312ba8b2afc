// TensorFlow's tutorial "Custom training with tf.distribute.Strategy" in C++: a small CNN trained
// on Fashion-MNIST with MirroredStrategy (or MultiWorkerMirroredStrategy under tools/launch.sh),
// with the tutorial's model, loss (compute_average_loss plus the scaled L2 regularisation), Adam,
// 64 examples per replica, metrics and a checkpoint every second epoch. Prints, per epoch,
//
//   Epoch 1, Loss: ..., Accuracy: ..., Test Loss: ..., Test Accuracy: ...
//
// as the tutorial does (accuracies in percent). The model computes with Eigen on CPU replicas,
// one thread each (examples/fashion/cnn.hpp); on one worker Adam's step sums the gradients over the
// replicas and updates in one pass, with several they are all-reduced in buckets while the backward
// pass goes on (examples/fashion/train.hpp).
//
//   fashion_mnist [--devices CPU:0,CPU:1] [--epochs 10] [--batch-per-replica 64] [--learning-rate 0.001]
//                 [--seed 0] [--initial-weights FILE] [--data DIR] [--train-examples N] [--test-examples N]
//                 [--no-shuffle]
//                 [--strategy mirrored|multi_worker] [--shard-optimizer-state] [--compression none|fp16|bf16]
//                 [--accumulate K] [--bucket-bytes N] [--checkpoint-dir DIR] [--save-every-steps N]
//                 [--timeline trace.json] [--step-losses FILE]
// (`--flag value` or `--flag=value`; `--help` lists them with their defaults.)
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <mirrored/mirrored.hpp>

#include "common/cli.hpp"
#include "common/raise_at_step.hpp"
#include "common/strategy.hpp"
#include "fashion/fashion_data.hpp"
#include "fashion/train.hpp"

namespace {

struct Args {
  std::vector<std::string> devices = {"CPU:0", "CPU:1"};
  examples::DistributionFlags distribution;  // --strategy, --compression, --timeline
  fashion::TrainConfig cfg;
  std::string data = fashion::default_fashion_mnist_dir();
  int64_t train_examples = 0, test_examples = 0;
  std::string step_losses;  // --step-losses: every step's loss, one line each
};

// Flags, checked before anything is printed; exits 2 on a usage error, with a message naming the flag.
Args parse(int argc, char** argv) {
  using examples::integer_at_least;
  using examples::with_default;
  Args a;
  CLI::App app{
      "Trains the CNN of TensorFlow's tutorial \"Custom training with tf.distribute.Strategy\" on "
      "Fashion-MNIST with MirroredStrategy, printing the tutorial's metrics after every epoch.",
      "fashion_mnist"};
  app.get_formatter()->column_width(28);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "fashion_mnist: " + std::string(e.what()) + "\nRun 'fashion_mnist --help' for the flags.\n";
  });
  std::string devices;
  app.add_option("--devices", devices,
                 "Comma-separated CPU replicas (default: CPU:0,CPU:1). CPU only: the model computes with Eigen "
                 "on the host, one thread per replica, so GPUs are left out even where the build has CUDA")
      ->type_name("LIST");
  app.add_option("--epochs", a.cfg.epochs, with_default("Passes over the training set", a.cfg.epochs))
      ->type_name("N")
      ->check(integer_at_least<int>(1));
  app.add_option("--batch-per-replica", a.cfg.batch_per_replica,
                 with_default("Examples per replica and step; the global batch is this times the replicas",
                              a.cfg.batch_per_replica))
      ->type_name("N")
      ->check(integer_at_least<int64_t>(1));
  app.add_option("--learning-rate", a.cfg.learning_rate, with_default("Adam's step size", a.cfg.learning_rate))
      ->type_name("X")
      ->check(examples::positive_finite_number());
  app.add_option("--seed", a.cfg.seed, with_default("Seed of the initial weights and the shuffling", a.cfg.seed))
      ->type_name("N")
      ->check(integer_at_least<uint64_t>(0));
  app.add_option("--initial-weights", a.cfg.initial_weights,
                 "Start from the weights of this safetensors file (conv2d/kernel, ... dense_1/bias, float32) "
                 "instead of drawing them from --seed")
      ->type_name("PATH")
      ->check(examples::must_be("must be an existing file", [](const std::string& v) {
        std::error_code ec;
        return std::filesystem::is_regular_file(v, ec);
      }));
  app.add_option("--data", a.data,
                 with_default("Directory of the IDX files (train-images-idx3-ubyte[.gz], ...; Debian's "
                              "dataset-fashion-mnist)",
                              a.data))
      ->type_name("DIR")
      ->check(examples::must_be("must be an existing directory", [](const std::string& v) {
        std::error_code ec;
        return std::filesystem::is_directory(v, ec);
      }));
  app.add_option("--train-examples", a.train_examples,
                 "Train on the first N training examples only (default: all 60000)")
      ->type_name("N")
      ->check(integer_at_least<int64_t>(1));
  app.add_option("--test-examples", a.test_examples, "Test on the first N test examples only (default: all 10000)")
      ->type_name("N")
      ->check(integer_at_least<int64_t>(1));
  bool no_shuffle = false;
  app.add_flag("--no-shuffle", no_shuffle, "Train on the examples in file order every epoch (for comparisons)");
  app.add_flag("--shard-optimizer-state", a.cfg.shard_optimizer_state,
               "Keep each replica's slice of Adam's slots only (the same weights, 1/N of the state)");
  app.add_option("--accumulate", a.cfg.accumulate,
                 with_default("Micro-batches per step (gradient accumulation): each replica trains its slice as K "
                              "micro-batches and applies their summed gradients once; K must divide "
                              "--batch-per-replica",
                              a.cfg.accumulate))
      ->type_name("K")
      ->check(integer_at_least<int>(1));
  app.add_option("--bucket-bytes", a.cfg.bucket_bytes,
                 "Reduce the gradients in buckets of N bytes whose all-reduces overlap the backward pass on "
                 "communication threads; 0: after the backward pass, by Adam's step (on one worker the sum fused with "
                 "the update, on the replica threads) (default: 0 on one worker, 65536 with several)")
      ->type_name("N")
      ->check(integer_at_least<int64_t>(0));
  app.add_option("--step-losses", a.step_losses,
                 "Write every step's loss to this file, one line each: epoch, step (from 1) and the loss as float32 "
                 "(the replicas' shares summed, as the tutorial's distributed_train_step returns it)")
      ->type_name("PATH");
  app.add_option("--checkpoint-dir", a.cfg.checkpoint_dir,
                 "Checkpoints in this directory after epochs 1, 3, 5, ... and the last (the tutorial's every "
                 "second epoch); resume from the newest; save and exit with status 75 on SIGTERM (default: none)")
      ->type_name("DIR");
  app.add_option("--save-every-steps", a.cfg.save_every_steps,
                 with_default("With --checkpoint-dir: also save every N steps (0: never)", a.cfg.save_every_steps))
      ->type_name("N")
      ->check(integer_at_least<int64_t>(0));
  examples::add_distribution_flags(app, a.distribution);
  app.allow_extras();
  try {
    app.parse(argc, argv);
    examples::reject_extras(app);
    a.cfg.shuffle = !no_shuffle;
    a.cfg.compression = a.distribution.compression_kind();
    if (!devices.empty()) a.devices = examples::split_list(devices);
    for (const auto& d : a.devices) {
      const bool cpu = d.find("CPU") != std::string::npos || d.find("cpu") != std::string::npos;
      if (!cpu)
        throw CLI::ValidationError("--devices",
                                   "CPU replicas only (the model computes with Eigen on the host), got '" + d + "'");
    }
    if (a.cfg.save_every_steps > 0 && a.cfg.checkpoint_dir.empty())
      throw CLI::ValidationError("--save-every-steps", "needs --checkpoint-dir");
    if (a.cfg.accumulate > a.cfg.batch_per_replica || a.cfg.batch_per_replica % a.cfg.accumulate != 0)
      throw CLI::ValidationError("--accumulate", std::to_string(a.cfg.accumulate) +
                                                     " does not divide the batch per replica (" +
                                                     std::to_string(a.cfg.batch_per_replica) + ")");
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // --help: the help on stdout, 0; else the error on stderr
    std::exit(rc == 0 ? 0 : 2);
  }
  return a;
}

// A metric as the tutorial prints it: a float32 value in Python's shortest round-trip form.
std::string py_float(double value) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<double>(static_cast<float>(value)));
  std::string out(buf, ec == std::errc() ? end : buf);
  if (out.find_first_of(".en") == std::string::npos) out += ".0";  // Python's 1.0, not 1
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
#ifdef MIRRORED_FASHION_AVX2
  // The model's arithmetic was compiled for AVX2 and FMA (-DMIRRORED_FASHION_AVX2, on by default
  // where the build machine has them); stop with a message instead of an illegal instruction.
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::cerr << "fashion_mnist: built for AVX2 and FMA, which this CPU lacks; configure with "
                 "-DMIRRORED_FASHION_AVX2=OFF\n";
    return 1;
  }
#endif
  // Opened before anything is printed, like a flag's check.
  std::FILE* step_losses = nullptr;
  if (!args.step_losses.empty()) {
    step_losses = std::fopen(args.step_losses.c_str(), "w");
    if (!step_losses) {
      std::cerr << "fashion_mnist: --step-losses: cannot write '" << args.step_losses << "': " << std::strerror(errno)
                << "\n";
      return 2;
    }
  }
  try {
    const fashion::FashionMnist data = fashion::load_fashion_mnist(args.data, args.train_examples, args.test_examples);
    const std::unique_ptr<mirrored::Strategy> strategy =
        examples::make_strategy(args.distribution.strategy, args.devices);
    if (!args.distribution.timeline.empty())
      mirrored::timeline::start(args.distribution.timeline);  // after the strategy: its file name
    const int n = strategy->num_replicas_in_sync();
    std::printf("training on %lld examples, testing on %lld; %d replicas (", static_cast<long long>(data.train.size()),
                static_cast<long long>(data.test.size()), n);
    for (std::size_t i = 0; i < args.devices.size(); ++i) std::printf("%s%s", i ? ", " : "", args.devices[i].c_str());
    std::printf("), global batch %lld (%lld per replica), adam %g",
                static_cast<long long>(args.cfg.batch_per_replica * n),
                static_cast<long long>(args.cfg.batch_per_replica), args.cfg.learning_rate);
    if (args.cfg.accumulate > 1) std::printf(", %d micro-batches per replica and step", args.cfg.accumulate);
    std::printf("\n");
    std::fflush(stdout);
    fashion::TrainConfig cfg = args.cfg;
    cfg.after_step = examples::raise_at_step_hook(strategy->extended().worker_index());
    const auto result = fashion::train(*strategy, data, cfg, [step_losses](const fashion::EpochMetrics& m) {
      if (step_losses) {
        for (std::size_t i = 0; i < m.step_losses.size(); ++i)
          std::fprintf(step_losses, "%d %lld %s\n", m.epoch,
                       static_cast<long long>(m.first_step) + static_cast<long long>(i),
                       py_float(m.step_losses[i]).c_str());
        std::fflush(step_losses);
      }
      std::printf("Epoch %d, Loss: %s, Accuracy: %s, Test Loss: %s, Test Accuracy: %s\n", m.epoch,
                  py_float(m.loss).c_str(), py_float(100 * m.accuracy).c_str(), py_float(m.test_loss).c_str(),
                  py_float(100 * m.test_accuracy).c_str());
      std::fflush(stdout);
    });
    if (result.resumed_at_step > 0)
      std::printf("resumed from the checkpoint of step %lld\n", static_cast<long long>(result.resumed_at_step));
    std::printf("training loop: %lld examples in %.3f s, %.0f examples/s (tests excluded)\n",
                static_cast<long long>(result.examples), result.train_seconds,
                result.train_seconds > 0 ? static_cast<double>(result.examples) / result.train_seconds : 0.0);
    if (!result.final_checkpoint.empty())
      std::printf("saved the finished training to %s\n", result.final_checkpoint.c_str());
    if (step_losses) std::fclose(step_losses);
    examples::finish_timeline();
  } catch (const mirrored::Error& e) {
    return examples::exit_status_for("fashion_mnist", args.distribution.strategy, e);
  }
}
