// A newcomer's training program, written from README.md and the docs it links only: linear
// regression y = 2x + 1 on two CPU replicas with a distributed, shuffled dataset, SGD applied inside
// run, and a CheckpointManager that saves the model, the optimizer and the input iterator and
// restores them into a fresh model. Exits 0 only when the loss falls, the restore is exact and the
// restored model trains on exactly as the saved one does; otherwise it says what failed and exits 1.
#include <mirrored/mirrored.hpp>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace mirrored;

namespace {

constexpr int64_t kGlobalBatch = 4;
constexpr int64_t kRows = 8;

using Batch = std::tuple<Tensor<float>, Tensor<float>>;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "newcomer: FAILED: " << what << "\n";
    ++failures;
  }
}

// x = 0..7 and y = 2x + 1: integer-valued floats, so every sum is exact and the run deterministic.
// Built afresh for each model, as a restarted program would build it.
data::Dataset<Batch> make_dataset() {
  std::vector<float> xs, ys;
  for (int64_t i = 0; i < kRows; ++i) {
    xs.push_back(float(i));
    ys.push_back(2.0f * float(i) + 1.0f);
  }
  return data::Dataset<>::from_tensor_slices(Tensor<float>::from_vector(xs, {kRows}),
                                             Tensor<float>::from_vector(ys, {kRows}))
      .shuffle(kRows, /*seed=*/7)
      .batch(kGlobalBatch, /*drop_remainder=*/true)
      .repeat();
}

// The model's variables and optimizer, made in the strategy's scope so that every replica holds a
// mirrored copy.
struct Model {
  Variable<float> w;
  Variable<float> b;
  optimizers::SGD<float> opt;

  Model(MirroredStrategy& strategy, float w0, float b0)
      : w(make(strategy, w0, "dense/kernel")),
        b(make(strategy, b0, "dense/bias")),
        opt(optimizers::SGDOptions{.learning_rate = 0.02}) {}

  static Variable<float> make(MirroredStrategy& strategy, float v, const std::string& name) {
    auto scope = strategy.scope();
    return Variable<float>(Tensor<float>::scalar(v), VariableOptions{.name = name});
  }

  // One step of the replica's slice: the mean squared error over the global batch, its gradients
  // worked out by hand, and SGD's update (the gradients are summed over the replicas inside it).
  Tensor<float> step(const Batch& batch) {
    const auto& [x, y] = batch;
    Tensor<float> err = x * w.value() + b.value() - y;
    Tensor<float> loss = nn::compute_average_loss(err * err, kGlobalBatch);
    Tensor<float> grad_w = nn::compute_average_loss(err * x * 2.0f, kGlobalBatch);
    Tensor<float> grad_b = nn::compute_average_loss(err * 2.0f, kGlobalBatch);
    opt.apply_gradients({{grad_w, w}, {grad_b, b}});
    return loss;
  }

  // Runs `steps` steps from `input` and returns each step's loss over the global batch.
  std::vector<float> train(MirroredStrategy& strategy, DistributedIterator<Batch>& input, int steps) {
    std::vector<float> losses;
    for (int i = 0; i < steps; ++i) {
      PerReplica<Batch> batch = input.get_next();
      auto per_replica_loss = strategy.run([this](const Batch& slice) { return step(slice); }, batch);
      losses.push_back(strategy.reduce(ReduceOp::SUM, per_replica_loss, std::nullopt).item());
    }
    return losses;
  }

  std::vector<float> weights() const { return {w.value().item(), b.value().item()}; }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string show(const std::vector<float>& v) {
  std::ostringstream out;
  out.precision(9);
  for (float f : v) out << f << " ";
  return out.str();
}

}  // namespace

int run_program() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("mirrored_newcomer_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);

  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  check(strategy.num_replicas_in_sync() == 2, "two replicas in sync");

  // Train, then save the model, its optimizer and the input's position.
  Model model(strategy, 0.0f, 0.0f);
  auto dist = strategy.experimental_distribute_dataset(make_dataset());
  auto input = dist.begin();
  checkpoint::CheckpointManager manager(strategy, dir.string(), /*max_to_keep=*/2);
  manager.track("dense/kernel", model.w);
  manager.track("dense/bias", model.b);
  manager.track("optimizer", model.opt);
  manager.track("input", input);

  constexpr int kSteps = 201;  // odd: the save falls mid-epoch, with rows left in the shuffle buffer
  std::vector<float> losses = model.train(strategy, input, kSteps);
  const float first = (losses[0] + losses[1]) / 2, last = (losses[kSteps - 2] + losses[kSteps - 1]) / 2;
  std::cout << "loss: first steps " << first << ", last steps " << last << "\n";
  check(std::isfinite(last) && last < first / 100,
        "the loss falls a hundredfold (" + std::to_string(first) + " -> " + std::to_string(last) + ")");
  const std::vector<float> saved = model.weights();
  std::cout << "w, b after " << kSteps << " steps: " << show(saved) << "\n";
  check(std::abs(saved[0] - 2.0f) < 0.05f && std::abs(saved[1] - 1.0f) < 0.2f, "w, b near 2, 1");
  manager.save(kSteps);
  check(manager.latest_checkpoint().has_value(), "latest_checkpoint after save");

  // The saved model goes on training; the restored one must follow it bit for bit.
  constexpr int kMore = 20;
  const std::vector<float> more_losses = model.train(strategy, input, kMore);
  const std::vector<float> continued = model.weights();

  // A fresh model with other initial values, a fresh optimizer and a fresh input pipeline, restored
  // from the checkpoint by a second manager tracking them under the same names.
  Model fresh(strategy, -3.0f, 5.0f);
  auto fresh_dist = strategy.experimental_distribute_dataset(make_dataset());
  auto fresh_input = fresh_dist.begin();
  checkpoint::CheckpointManager restorer(strategy, dir.string());
  restorer.track("dense/kernel", fresh.w);
  restorer.track("dense/bias", fresh.b);
  restorer.track("optimizer", fresh.opt);
  restorer.track("input", fresh_input);
  restorer.restore_or_initialize();

  const std::vector<float> restored = fresh.weights();
  check(same_bits(restored, saved), "restored weights equal the saved ones bit for bit (saved " + show(saved) +
                                        ", restored " + show(restored) + ")");
  check(fresh.opt.iterations() == model.opt.iterations() - kMore,
        "the restored optimizer's step counter is the saved one");

  const std::vector<float> fresh_losses = fresh.train(strategy, fresh_input, kMore);
  check(same_bits(fresh_losses, more_losses), "the restored model sees the same batches and losses");
  check(same_bits(fresh.weights(), continued), "training continues from the restore exactly as without it (" +
                                                   show(continued) + " vs " + show(fresh.weights()) + ")");
  check(fresh_losses.back() <= last * 2, "the restored model's loss stays low");

  std::filesystem::remove_all(dir);
  if (failures != 0) {
    std::cerr << "newcomer: " << failures << " check(s) failed\n";
    return 1;
  }
  std::cout << "newcomer: OK\n";
  return 0;
}

int main() {
  try {
    return run_program();
  } catch (const std::exception& e) {
    std::cerr << "newcomer: FAILED: " << e.what() << "\n";
    return 1;
  }
}
