// train_digits' flags (flags.hpp), parsed with CLI11 (Debian libcli11-dev, header-only): only
// this file of the example compiles it.
#include "digits/flags.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <mirrored/communication_options.hpp>
#include <mirrored/device.hpp>

namespace digits {
namespace {

// A CLI11 validator (no text of its own in --help): `ok(value)` says whether the value is good.
template <class Ok>
CLI::Validator must_be(const std::string& what, Ok ok) {
  return CLI::Validator([=](std::string& v) { return ok(v) ? std::string() : what + ", got '" + v + "'"; }, "");
}

bool is_uint(const std::string& v) { return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos; }

// Whether all of `v` is a number of type T (in range).
template <class T>
bool converts(const std::string& v, T& out) {
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && end == v.data() + v.size();
}

}  // namespace

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
  auto dflt = [](const std::string& text, const auto& value) {
    std::ostringstream os;
    os << text << " (default: " << value << ")";
    return os.str();
  };
  // --save and --timeline write a file: its directory must exist.
  const CLI::Validator in_existing_directory = must_be("must be in an existing directory", [](const std::string& v) {
    const std::filesystem::path dir = std::filesystem::path(v).parent_path();
    std::error_code ec;
    return dir.empty() || std::filesystem::is_directory(dir, ec);
  });
  std::string devices;
  app.add_option("--devices", devices,
                 "Comma-separated replica devices, e.g. CPU:0,CPU:1 (default: every GPU, else CPU:0,CPU:1)")
      ->type_name("LIST");
  app.add_option("--epochs", a.cfg.epochs, dflt("Passes over the training set", a.cfg.epochs))
      ->type_name("N")
      ->check(must_be("must be a positive integer", [](const std::string& v) {
        int x = 0;
        return is_uint(v) && converts(v, x) && x >= 1;
      }));
  app.add_option("--global-batch", a.cfg.global_batch,
                 dflt("Examples per step, over all replicas; at least the number of replicas", a.cfg.global_batch))
      ->type_name("N")
      ->check(must_be("must be a positive integer", [](const std::string& v) {
        int64_t x = 0;
        return is_uint(v) && converts(v, x) && x >= 1;
      }));
  app.add_option("--optimizer", a.cfg.optimizer, dflt("sgd or adam", a.cfg.optimizer))
      ->type_name("NAME")
      ->check(must_be("must be sgd or adam", [](const std::string& v) { return v == "sgd" || v == "adam"; }));
  app.add_option("--learning-rate", a.cfg.learning_rate, "Step size (default: 0.5 for sgd, 0.01 for adam)")
      ->type_name("X")
      ->check(must_be("must be a positive finite number", [](const std::string& v) {
        double x = 0;
        return converts(v, x) && std::isfinite(x) && x > 0;
      }));
  app.add_option("--seed", a.cfg.seed,
                 dflt("Seed of the initial weights, the held-out split and the shuffling", a.cfg.seed))
      ->type_name("N")
      ->check(must_be("must be a non-negative integer", [](const std::string& v) {
        uint64_t x = 0;
        return is_uint(v) && converts(v, x);
      }));
  app.add_option("--data", a.data, dflt("The digits CSV, gzip-compressed or plain", a.data))
      ->type_name("PATH")
      ->check(must_be("must be an existing file", [](const std::string& v) {
        std::error_code ec;
        return std::filesystem::is_regular_file(v, ec);
      }));
  app.add_option("--save", a.save, "Save the trained variables to this safetensors file (default: do not save)")
      ->type_name("PATH")
      ->check(in_existing_directory);
  app.add_option("--timeline", a.timeline,
                 "Write a timeline of the training (open it in ui.perfetto.dev) to this JSON file (default: none)")
      ->type_name("PATH")
      ->check(in_existing_directory);
  app.add_option("--strategy", a.strategy,
                 dflt("mirrored, or multi_worker for the workers TF_CONFIG names (see tools/launch.sh)", a.strategy))
      ->type_name("NAME")
      ->check(must_be("must be mirrored or multi_worker",
                      [](const std::string& v) { return v == "mirrored" || v == "multi_worker"; }));
  app.add_flag("--verbose", a.verbose,
               "Print the bytes between host and each replica device, and the host waits, per training step");
  app.add_flag("--shard-optimizer-state", a.cfg.shard_optimizer_state,
               "Keep each replica's slice of the optimizer's slots only (the same weights, 1/N of the state)");
  std::string compression = "none";
  app.add_option("--compression", compression,
                 dflt("How gradients cross workers: none, fp16 or bf16 (--strategy multi_worker)", compression))
      ->type_name("NAME")
      ->check(must_be("must be none, fp16 or bf16",
                      [](const std::string& v) { return v == "none" || v == "fp16" || v == "bf16"; }));
  app.add_option("--accumulate", a.cfg.accumulate,
                 dflt("Micro-batches per step (gradient accumulation): each step trains K micro-batches of "
                      "global-batch/K rows and applies their summed gradients once; K must divide --global-batch",
                      a.cfg.accumulate))
      ->type_name("K")
      ->check(must_be("must be a positive integer", [](const std::string& v) {
        int x = 0;
        return is_uint(v) && converts(v, x) && x >= 1;
      }));
  app.add_option("--checkpoint-dir", a.cfg.checkpoint_dir,
                 "Fault-tolerant training: keep checkpoints in this directory, resume from the newest, save and exit "
                 "with status 75 on SIGTERM (default: none)")
      ->type_name("DIR");
  app.add_option("--save-every-steps", a.cfg.save_every_steps,
                 dflt("With --checkpoint-dir: also save every N steps (0: only on SIGTERM and at the end)",
                      a.cfg.save_every_steps))
      ->type_name("N")
      ->check(must_be("must be a non-negative integer", [](const std::string& v) {
        int64_t x = 0;
        return is_uint(v) && converts(v, x);
      }));
  app.add_flag("--eval-every-epoch", a.cfg.eval_every_epoch,
               "Print the held-out accuracy after every epoch and the training loop's time (evaluations excluded)");
  app.allow_extras();  // reported below, in the order given (CLI11 lists them reversed)
  try {
    app.parse(argc, argv);
    if (const auto extra = app.remaining(); !extra.empty()) {
      throw CLI::ExtrasError(
          extra[0].rfind('-', 0) == 0 ? "unknown flag " + extra[0] : "unexpected argument '" + extra[0] + "'",
          CLI::ExitCodes::ExtrasError);
    }
    a.cfg.compression = compression == "fp16"   ? mirrored::Compression::FP16
                        : compression == "bf16" ? mirrored::Compression::BF16
                                                : mirrored::Compression::NONE;
    if (devices.empty()) {
      // All GPUs, else two CPU replicas.
      for (const auto& d : mirrored::list_logical_devices(mirrored::DeviceType::GPU))
        a.devices.push_back(d.short_name());
      if (a.devices.empty()) a.devices = {"CPU:0", "CPU:1"};
    } else {
      std::stringstream ss(devices);
      for (std::string d; std::getline(ss, d, ',');) a.devices.push_back(d);
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
