// train_digits' flags (flags.hpp), parsed with CLI11 (Debian libcli11-dev, header-only) through
// the examples' shared validators (common/cli.hpp): only this file of the example compiles it.
#include "digits/flags.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <mirrored/device.hpp>

#include "common/cli.hpp"

namespace digits {

// Flags, checked before anything is printed: a mistake costs no training time. `--flag value` and
// `--flag=value` both work; --help lists every flag with its default. Exits 2 on a usage error,
// with a message naming the flag.
Args parse_args(int argc, char** argv) {
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
                 "Comma-separated replica devices, e.g. CPU:0,CPU:1 (default: every GPU, else CPU:0,CPU:1; with "
                 "--strategy multi_worker, this worker's share of its machine's GPUs: worker r of the n a launcher "
                 "started there takes the r-th of n equal shares)")
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
      ->check(examples::must_be("must be an existing file", [](const std::string& v) {
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
      // All GPUs, else two CPU replicas. A worker of several leaves its GPUs to the strategy, which
      // gives it its share of its machine's (empty: MultiWorkerMirroredStrategy's default).
      const auto gpus = mirrored::list_logical_devices(mirrored::DeviceType::GPU);
      if (gpus.empty()) {
        a.devices = {"CPU:0", "CPU:1"};
      } else if (a.distribution.strategy != "multi_worker") {
        for (const auto& d : gpus) a.devices.push_back(d.short_name());
      }
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

}  // namespace digits
