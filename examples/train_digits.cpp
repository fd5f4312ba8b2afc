// Trains a 64-64-10 MLP on the digits data set with MirroredStrategy: every replica computes the
// gradients of its slice of each global batch, the optimizer all-reduces them, and every replica
// applies the same update. Prints held-out accuracy; can save a checkpoint.
//
//   train_digits [--devices CPU:0,CPU:1] [--epochs 20] [--global-batch 32] [--optimizer sgd|adam]
//                [--learning-rate X] [--seed 0] [--data data/digits.csv.gz] [--save model.safetensors]
//                [--strategy mirrored|multi_worker]
//
// --strategy multi_worker trains with MultiWorkerMirroredStrategy over the workers TF_CONFIG
// names (--devices are each worker's own replicas; see tools/launch.sh); only the chief saves.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>
#include <mirrored/variable_checkpoint.hpp>

#include "digits/digits_data.hpp"
#include "digits/mlp.hpp"
#include "digits/train.hpp"

namespace {

struct Args {
  std::vector<std::string> devices;
  std::string strategy = "mirrored";
  digits::TrainConfig cfg;
  std::string data = digits::default_digits_path();
  std::string save;
};

[[noreturn]] void usage(const std::string& error) {
  const bool help = error.empty();
  (help ? std::cout : std::cerr)
      << (help ? "" : "train_digits: " + error + "\n")
      << "usage: train_digits [--devices CPU:0,CPU:1] [--epochs N] [--global-batch N] [--optimizer sgd|adam]\n"
      << "                    [--learning-rate X] [--seed N] [--data PATH] [--save PATH]\n"
      << "                    [--strategy mirrored|multi_worker]\n";
  std::exit(help ? 0 : 2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("");
    if (i + 1 >= argc) usage("missing value after " + flag);
    const std::string v = argv[++i];
    try {
      if (flag == "--devices") {
        std::stringstream ss(v);
        for (std::string d; std::getline(ss, d, ',');) a.devices.push_back(d);
      } else if (flag == "--epochs")
        a.cfg.epochs = std::stoi(v);
      else if (flag == "--global-batch")
        a.cfg.global_batch = std::stoll(v);
      else if (flag == "--optimizer")
        a.cfg.optimizer = v;
      else if (flag == "--learning-rate")
        a.cfg.learning_rate = std::stod(v);
      else if (flag == "--seed")
        a.cfg.seed = std::stoull(v);
      else if (flag == "--data")
        a.data = v;
      else if (flag == "--save")
        a.save = v;
      else if (flag == "--strategy")
        a.strategy = v;
      else
        usage("unknown flag " + flag);
    } catch (const std::logic_error&) {
      usage("bad value '" + v + "' for " + flag);
    }
  }
  if (a.cfg.epochs < 1) usage("--epochs must be at least 1");
  if (a.strategy != "mirrored" && a.strategy != "multi_worker") usage("--strategy must be mirrored or multi_worker");
  if (a.devices.empty()) {
    // All GPUs, else two CPU replicas.
    for (const auto& d : mirrored::list_logical_devices(mirrored::DeviceType::GPU)) a.devices.push_back(d.short_name());
    if (a.devices.empty()) a.devices = {"CPU:0", "CPU:1"};
  }
  return a;
}

// A progress bar that redraws in place on a terminal; plain lines otherwise.
void show(const digits::EpochReport& r, int epochs, bool tty) {
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
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    const digits::Dataset all = digits::load_digits(args.data);
    const digits::Split split = digits::split_digits(all, args.cfg.test_fraction, args.cfg.seed);
    std::unique_ptr<mirrored::Strategy> owned;
    if (args.strategy == "multi_worker")
      owned = std::make_unique<mirrored::MultiWorkerMirroredStrategy>(mirrored::CommunicationOptions{}, nullptr,
                                                                      args.devices);
    else
      owned = std::make_unique<mirrored::MirroredStrategy>(args.devices);
    mirrored::Strategy& strategy = *owned;
    std::printf("training on %zu examples, holding out %zu; %d replicas (", static_cast<size_t>(split.train.size()),
                static_cast<size_t>(split.test.size()), strategy.num_replicas_in_sync());
    for (std::size_t i = 0; i < args.devices.size(); ++i) std::printf("%s%s", i ? ", " : "", args.devices[i].c_str());
    std::printf("), global batch %lld, %s\n", static_cast<long long>(args.cfg.global_batch),
                args.cfg.optimizer.c_str());
    const bool tty = isatty(STDOUT_FILENO);
    const auto result =
        digits::train(strategy, split, args.cfg, [&](const digits::EpochReport& r) { show(r, args.cfg.epochs, tty); });
    std::printf("held-out accuracy: %.2f%% (%lld examples) after %d epochs in %.2f s\n", 100 * result.test_accuracy,
                static_cast<long long>(split.test.size()), args.cfg.epochs, result.seconds);
    if (!args.save.empty() && strategy.extended().should_checkpoint()) {
      mirrored::checkpoint::VariableMap vars;
      for (const auto& v : result.variables) vars.emplace(v.name(), v);
      mirrored::checkpoint::save(args.save, vars, {{"model", "digits-mlp-64-64-10"}});
      std::printf("saved checkpoint to %s\n", args.save.c_str());
    }
  } catch (const mirrored::Error& e) {
    std::cerr << "train_digits: " << mirrored::error_code_name(e.code()) << ": " << e.what() << "\n";
    return 1;
  }
}
