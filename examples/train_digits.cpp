// Trains a 64-64-10 MLP on the digits data set with MirroredStrategy: every replica computes the
// gradients of its slice of each global batch, the optimizer all-reduces them, and every replica
// applies the same update. Prints held-out accuracy; can save a checkpoint.
//
//   train_digits [--devices CPU:0,CPU:1] [--epochs 20] [--global-batch 32] [--optimizer sgd|adam]
//                [--learning-rate X] [--seed 0] [--data data/digits.csv.gz] [--save model.safetensors]
//                [--strategy mirrored|multi_worker] [--timeline trace.json] [--verbose]
//                [--shard-optimizer-state] [--compression none|fp16|bf16] [--eval-every-epoch] [--accumulate K]
//                [--checkpoint-dir DIR] [--save-every-steps N]
// (`--flag value` or `--flag=value`; `--help` lists them with their defaults.)
//
// --strategy multi_worker trains with MultiWorkerMirroredStrategy over the workers of whichever
// launcher started it (cluster_resolver_from_environment: TF_CONFIG as tools/launch.sh sets it,
// torchrun, mpirun, srun; docs/multi_worker.md); --devices are each worker's own replicas; only
// the chief saves. A worker that ends because a peer was lost (UNAVAILABLE, DEADLINE_EXCEEDED)
// exits with status 75, as a preempted one does, so that the launcher restarts the job.
// --timeline writes a Chrome-trace / Perfetto timeline of the training (docs/timeline.md); each worker
// of a multi-worker job writes its own file (trace.worker<k>.json).
// --verbose prints, per replica device, what crossed between the host and the device during
// training (bytes each way and host waits), in all and per step.
// --accumulate K accumulates gradients: each step's global batch is trained as K micro-batches of
// global-batch/K rows (each replica cuts its slice into K), whose gradients each replica sums on its
// device (optimizers::GradientAccumulator) before one all-reduce and one optimizer step.
// --eval-every-epoch prints the held-out accuracy after every epoch with the training loop's time so
// far, and the training loop's examples per second at the end (bench/e2e_digits.py reads them).
// --checkpoint-dir makes the training survive preemption and crashes (docs/fault_tolerance.md):
// it resumes from the directory's newest checkpoint, saves and exits with status 75 on SIGTERM
// (tools/launch.sh --max-restarts restarts it), and with --save-every-steps also saves periodically.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <mirrored/mirrored.hpp>
#include <mirrored/variable_checkpoint.hpp>

#include "common/cli.hpp"
#include "common/raise_at_step.hpp"
#include "common/strategy.hpp"
#include "digits/digits_data.hpp"
#include "digits/mlp.hpp"
#include "digits/train.hpp"

namespace {

struct Args {
  std::vector<std::string> devices;
  examples::DistributionFlags distribution;  // --strategy, --compression, --timeline
  digits::TrainConfig cfg;
  std::string data = digits::default_digits_path();
  std::string save;
  bool verbose = false;
};

using examples::must_be;

// Flags, checked before anything is printed: a mistake costs no training time. `--flag value` and
// `--flag=value` both work; --help lists every flag with its default. Exits 2 on a usage error,
// with a message naming the flag.
Args parse(int argc, char** argv) {
  Args a;
  CLI::App app{"Trains a 64-64-10 MLP on the digits data set with MirroredStrategy and prints held-out accuracy.",
               "train_digits"};
  app.get_formatter()->column_width(26);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "train_digits: " + std::string(e.what()) + "\nRun 'train_digits --help' for the flags.\n";
  });
  auto dflt = [](const std::string& text, const auto& value) { return examples::with_default(text, value); };
  std::string devices;
  app.add_option("--devices", devices,
                 "Comma-separated replica devices, e.g. CPU:0,CPU:1 (default: every GPU, else CPU:0,CPU:1)")
      ->type_name("LIST");
  app.add_option("--epochs", a.cfg.epochs, dflt("Passes over the training set", a.cfg.epochs))
      ->type_name("N")
      ->check(examples::integer_at_least<int>(1));
  app.add_option("--global-batch", a.cfg.global_batch,
                 dflt("Examples per step, over all replicas; at least the number of replicas", a.cfg.global_batch))
      ->type_name("N")
      ->check(examples::integer_at_least<int64_t>(1));
  app.add_option("--optimizer", a.cfg.optimizer, dflt("sgd or adam", a.cfg.optimizer))
      ->type_name("NAME")
      ->check(examples::one_of({"sgd", "adam"}));
  app.add_option("--learning-rate", a.cfg.learning_rate, "Step size (default: 0.5 for sgd, 0.01 for adam)")
      ->type_name("X")
      ->check(examples::positive_finite_number());
  app.add_option("--seed", a.cfg.seed,
                 dflt("Seed of the initial weights, the held-out split and the shuffling", a.cfg.seed))
      ->type_name("N")
      ->check(examples::integer_at_least<uint64_t>(0));
  app.add_option("--data", a.data, dflt("The digits CSV, gzip-compressed or plain", a.data))
      ->type_name("PATH")
      ->check(must_be("must be an existing file", [](const std::string& v) {
        std::error_code ec;
        return std::filesystem::is_regular_file(v, ec);
      }));
  app.add_option("--save", a.save, "Save the trained variables to this safetensors file (default: do not save)")
      ->type_name("PATH")
      ->check(examples::in_existing_directory());
  app.add_flag("--verbose", a.verbose,
               "Print the bytes between host and each replica device, and the host waits, per training step");
  app.add_flag("--shard-optimizer-state", a.cfg.shard_optimizer_state,
               "Keep each replica's slice of the optimizer's slots only (the same weights, 1/N of the state)");
  app.add_option("--accumulate", a.cfg.accumulate,
                 dflt("Micro-batches per step (gradient accumulation): each step trains K micro-batches of "
                      "global-batch/K rows and applies their summed gradients once; K must divide --global-batch",
                      a.cfg.accumulate))
      ->type_name("K")
      ->check(examples::integer_at_least<int>(1));
  app.add_option("--checkpoint-dir", a.cfg.checkpoint_dir,
                 "Fault-tolerant training: keep checkpoints in this directory, resume from the newest, save and exit "
                 "with status 75 on SIGTERM (default: none)")
      ->type_name("DIR");
  app.add_option("--save-every-steps", a.cfg.save_every_steps,
                 dflt("With --checkpoint-dir: also save every N steps (0: only on SIGTERM and at the end)",
                      a.cfg.save_every_steps))
      ->type_name("N")
      ->check(examples::integer_at_least<int64_t>(0));
  app.add_flag("--eval-every-epoch", a.cfg.eval_every_epoch,
               "Print the held-out accuracy after every epoch and the training loop's time (evaluations excluded)");
  examples::add_distribution_flags(app, a.distribution);
  app.allow_extras();  // reported below, in the order given (CLI11 lists them reversed)
  try {
    app.parse(argc, argv);
    examples::reject_extras(app);
    a.cfg.compression = a.distribution.compression_kind();
    if (devices.empty()) {
      // All GPUs, else two CPU replicas.
      for (const auto& d : mirrored::list_logical_devices(mirrored::DeviceType::GPU))
        a.devices.push_back(d.short_name());
      if (a.devices.empty()) a.devices = {"CPU:0", "CPU:1"};
    } else {
      a.devices = examples::split_list(devices);
    }
    if (a.cfg.save_every_steps > 0 && a.cfg.checkpoint_dir.empty())
      throw CLI::ValidationError("--save-every-steps", "needs --checkpoint-dir");
    if (a.cfg.global_batch < static_cast<int64_t>(a.devices.size()))
      throw CLI::ValidationError("--global-batch", std::to_string(a.cfg.global_batch) +
                                                       " is less than the number of replicas (" +
                                                       std::to_string(a.devices.size()) + ")");
    if (a.cfg.global_batch % a.cfg.accumulate != 0)
      throw CLI::ValidationError("--accumulate", std::to_string(a.cfg.accumulate) +
                                                     " does not divide the global batch (" +
                                                     std::to_string(a.cfg.global_batch) + ")");
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // --help: the help on stdout, 0; else the error on stderr
    std::exit(rc == 0 ? 0 : 2);
  }
  return a;
}

bool g_progress_line_open = false;  // a progress bar without its newline yet

// A progress bar that redraws in place on a terminal; plain lines otherwise.
void show(const digits::EpochReport& r, int epochs, bool tty) {
  g_progress_line_open = tty && !r.done;
  if (tty) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * r.step / r.steps);
    std::printf("\repoch %2d/%d [%s%s] %3lld/%lld steps  loss %.4f  %7.0f examples/s", r.epoch, epochs,
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                static_cast<long long>(r.step), static_cast<long long>(r.steps), r.mean_loss, r.examples_per_s);
    if (r.done) std::printf("\n");
    std::fflush(stdout);
  } else if (r.done) {
    std::printf("epoch %d/%d: %lld steps, loss %.4f, %.0f examples/s\n", r.epoch, epochs,
                static_cast<long long>(r.steps), r.mean_loss, r.examples_per_s);
  }
  if (r.done && r.test_accuracy >= 0) {
    std::printf("  after epoch %d: held-out accuracy %.2f%%, loss %.6f, training loop %.6f s, wall %.6f s\n", r.epoch,
                100 * r.test_accuracy, r.mean_loss, r.train_seconds, r.wall_seconds);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    const digits::Dataset all = digits::load_digits(args.data);
    const digits::Split split = digits::split_digits(all, args.cfg.test_fraction, args.cfg.seed);
    const std::unique_ptr<mirrored::Strategy> owned = examples::make_strategy(args.distribution.strategy, args.devices);
    mirrored::Strategy& strategy = *owned;
    if (!args.distribution.timeline.empty())
      mirrored::timeline::start(args.distribution.timeline);  // after the strategy: its file name
    std::printf("training on %zu examples, holding out %zu; %d replicas (", static_cast<size_t>(split.train.size()),
                static_cast<size_t>(split.test.size()), strategy.num_replicas_in_sync());
    for (std::size_t i = 0; i < args.devices.size(); ++i) std::printf("%s%s", i ? ", " : "", args.devices[i].c_str());
    std::printf("), global batch %lld, %s", static_cast<long long>(args.cfg.global_batch), args.cfg.optimizer.c_str());
    if (args.cfg.accumulate > 1)
      std::printf(", %d micro-batches of %lld per step", args.cfg.accumulate,
                  static_cast<long long>(args.cfg.global_batch / args.cfg.accumulate));
    std::printf("\n");
    digits::TrainConfig cfg = args.cfg;
    cfg.after_step = examples::raise_at_step_hook(strategy.extended().worker_index());
    const bool tty = isatty(STDOUT_FILENO);
    const auto devices = strategy.extended().worker_devices();
    std::vector<mirrored::TransferCounts> before;
    for (const auto& d : devices) before.push_back(mirrored::transfer_counts(d));
    int64_t steps = 0;
    const auto result = digits::train(strategy, split, cfg, [&](const digits::EpochReport& r) {
      ++steps;
      show(r, args.cfg.epochs, tty);
    });
    if (args.verbose) {
      // Everything from building the model to the last step (the input batches included).
      for (std::size_t i = 0; i < devices.size(); ++i) {
        const auto after = mirrored::transfer_counts(devices[i]);
        const auto per_step = [&](uint64_t a, uint64_t b) {
          return static_cast<double>(a - b) / std::max<int64_t>(steps, 1);
        };
        std::printf(
            "%s: host->device %llu bytes (%.1f per step), device->host %llu bytes (%.1f per step), "
            "host waits %llu (%.1f per step)\n",
            devices[i].short_name().c_str(),
            static_cast<unsigned long long>(after.host_to_device_bytes - before[i].host_to_device_bytes),
            per_step(after.host_to_device_bytes, before[i].host_to_device_bytes),
            static_cast<unsigned long long>(after.device_to_host_bytes - before[i].device_to_host_bytes),
            per_step(after.device_to_host_bytes, before[i].device_to_host_bytes),
            static_cast<unsigned long long>(after.host_syncs - before[i].host_syncs),
            per_step(after.host_syncs, before[i].host_syncs));
      }
    }
    if (result.resumed_at_step > 0)
      std::printf("resumed from the checkpoint of step %lld\n", static_cast<long long>(result.resumed_at_step));
    if (!result.final_checkpoint.empty())
      std::printf("saved the finished training to %s\n", result.final_checkpoint.c_str());
    std::printf("held-out accuracy: %.2f%% (%lld examples) after %d epochs in %.2f s\n", 100 * result.test_accuracy,
                static_cast<long long>(split.test.size()), args.cfg.epochs, result.seconds);
    if (args.cfg.eval_every_epoch)
      std::printf("training loop: %lld examples in %.6f s, %.0f examples/s (evaluations excluded)\n",
                  static_cast<long long>(result.examples), result.train_seconds,
                  result.train_seconds > 0 ? static_cast<double>(result.examples) / result.train_seconds : 0.0);
    if (!args.save.empty() && strategy.extended().should_checkpoint()) {
      mirrored::checkpoint::VariableMap vars;
      for (const auto& v : result.variables) vars.emplace(v.name(), v);
      mirrored::checkpoint::save(args.save, vars, {{"model", "digits-mlp-64-64-10"}});
      std::printf("saved checkpoint to %s\n", args.save.c_str());
    }
    examples::finish_timeline();
  } catch (const mirrored::Error& e) {
    if (g_progress_line_open) std::printf("\n");
    return examples::exit_status_for("train_digits", args.distribution.strategy, e);
  }
}
