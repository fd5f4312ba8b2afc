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
// torchrun, mpirun, srun; docs/multi_worker.md); --devices are each worker's own replicas (by
// default its share of its machine's GPUs); only the chief saves. A worker that ends because a peer was lost
// (UNAVAILABLE, DEADLINE_EXCEEDED) exits with status 75, as a preempted one does, so that the launcher restarts the
// job.
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
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>
#include <mirrored/variable_checkpoint.hpp>

#include "common/raise_at_step.hpp"
#include "common/strategy.hpp"
#include "digits/digits_data.hpp"
#include "digits/flags.hpp"
#include "digits/train.hpp"

namespace {

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
  const digits::Args args = digits::parse_args(argc, argv);
  try {
    const digits::Dataset all = digits::load_digits(args.data);
    const digits::Split split = digits::split_digits(all, args.cfg.test_fraction, args.cfg.seed);
    const std::unique_ptr<mirrored::Strategy> owned = examples::make_strategy(args.distribution.strategy, args.devices);
    mirrored::Strategy& strategy = *owned;
    if (!args.distribution.timeline.empty())
      mirrored::timeline::start(args.distribution.timeline);  // after the strategy: its file name
    std::printf("training on %zu examples, holding out %zu; %d replicas (", static_cast<size_t>(split.train.size()),
                static_cast<size_t>(split.test.size()), strategy.num_replicas_in_sync());
    const auto replicas = strategy.extended().worker_devices();
    for (std::size_t i = 0; i < replicas.size(); ++i)
      std::printf("%s%s", i ? ", " : "", replicas[i].short_name().c_str());
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
