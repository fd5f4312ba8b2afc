#pragma once
// Distributed training of the digits MLP with MirroredStrategy: the loop the train_digits
// example runs and the equivalence test checks. Header-only, example code.
//
// Each step takes a global batch of the (per-epoch shuffled) training set, cuts it into one
// consecutive slice per replica (the first G % N replicas get one more example; in a final
// partial batch trailing replicas may get none), and in `run` every replica computes the
// gradients of its slice's summed loss divided by the global batch size; the optimizer
// all-reduces them (SUM), so every replica applies the gradient of the global batch's mean loss.
// Only the order of the sums differs between replica counts.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "digits_data.hpp"
#include "mlp.hpp"

namespace digits {

struct TrainConfig {
  int epochs = 20;
  int64_t global_batch = 32;
  std::string optimizer = "sgd";  // "sgd" or "adam"
  double learning_rate = 0;       // 0: the optimizer's default here (sgd 0.5, adam 0.01)
  uint64_t seed = 0;
  double test_fraction = 0.2;
};

/// What one epoch reports (for progress output).
struct EpochReport {
  int epoch = 0;
  int64_t step = 0, steps = 0;
  double mean_loss = 0;   // mean per-example loss of the epoch so far
  double examples_per_s = 0;
  bool done = false;      // last step of the epoch
};

struct TrainResult {
  std::vector<mirrored::Variable<float>> variables;  // dense/kernel, dense/bias, dense_1/kernel, dense_1/bias
  double test_accuracy = 0;
  double final_loss = 0;
  double seconds = 0;
};

/// Rows [begin, end) of a tensor's first dimension, on `device`.
template <class T>
mirrored::Tensor<T> slice_rows(const mirrored::Tensor<T>& t, int64_t begin, int64_t end, const mirrored::Device& device) {
  int64_t row = 1;
  for (std::size_t d = 1; d < t.shape().size(); ++d) row *= t.shape()[d];
  mirrored::Shape shape = t.shape();
  shape[0] = end - begin;
  std::vector<T> values(t.data() + begin * row, t.data() + end * row);
  return mirrored::Tensor<T>::from_vector(std::move(values), shape, device);
}

/// Consecutive slice sizes of a global batch of `b` examples over `n` replicas (TF's BALANCED rule
/// for a full batch of `full`; a partial batch fills the slices in order).
inline std::vector<int64_t> slice_sizes(int64_t b, int64_t full, int n) {
  std::vector<int64_t> sizes(n, full / n);
  for (int64_t r = 0; r < full % n; ++r) ++sizes[r];
  int64_t left = b;
  for (auto& s : sizes) {
    s = std::min(s, left);
    left -= s;
  }
  return sizes;
}

inline TrainResult train(mirrored::Strategy& strategy, const Split& data, const TrainConfig& cfg,
                         const std::function<void(const EpochReport&)>& report = {}) {
  using namespace mirrored;
  const auto start = std::chrono::steady_clock::now();
  const int n = strategy.num_replicas_in_sync();
  const auto& devices = strategy.extended().worker_devices();
  TrainResult result;
  std::unique_ptr<optimizers::Optimizer<float>> opt;
  {
    auto scope = strategy.scope();
    const MlpParams init = init_mlp<float>(cfg.seed);
    const auto names = MlpParams::names();
    const auto tensors = init.tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i)
      result.variables.emplace_back(tensors[i], VariableOptions{.name = names[i]});
    if (cfg.optimizer == "adam") {
      opt = std::make_unique<optimizers::Adam<float>>(optimizers::AdamOptions{.learning_rate = cfg.learning_rate > 0 ? cfg.learning_rate : 0.01});
    } else if (cfg.optimizer == "sgd") {
      opt = std::make_unique<optimizers::SGD<float>>(optimizers::SGDOptions{.learning_rate = cfg.learning_rate > 0 ? cfg.learning_rate : 0.5});
    } else {
      throw InvalidArgumentError("--optimizer must be sgd or adam, got '" + cfg.optimizer + "'");
    }
    opt->build(result.variables);
  }
  MIRRORED_ENFORCE(cfg.global_batch >= n, InvalidArgumentError, "global batch ", cfg.global_batch,
                   " must be at least the number of replicas ", n);
  auto& vars = result.variables;
  const int64_t train_n = data.train.size();
  const int64_t steps = (train_n + cfg.global_batch - 1) / cfg.global_batch;

  // The model's math is Eigen on host memory: a GPU replica brings its batch and weights to the
  // host and sends its gradients back to its device, where they are all-reduced.
  auto on_host = [](const auto& t) { return t.device().is_host() ? t : t.to(cpu0); };

  // One step on one replica: gradients of (sum of its losses) / global batch; returns its loss sum.
  auto step_fn = [&](const Tensor<float>& x, const Tensor<int32_t>& y, int64_t batch) {
    const Device& device = x.device();
    MlpParams p{on_host(vars[0].value()), on_host(vars[1].value()), on_host(vars[2].value()), on_host(vars[3].value())};
    MlpStep s = mlp_loss_and_grads(p, on_host(x), on_host(y));
    const auto g = s.grads.tensors();
    optimizers::GradsAndVars<float> gv;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const Tensor<float> grad = g[i] / static_cast<float>(batch);
      gv.emplace_back(device.is_host() ? grad : grad.to(device), vars[i]);
    }
    opt->apply_gradients(gv);
    double loss = 0;
    for (float l : s.per_example_loss.to_vector()) loss += l;
    return loss;
  };

  for (int epoch = 1; epoch <= cfg.epochs; ++epoch) {
    const auto order = permutation(train_n, cfg.seed * 1000003 + static_cast<uint64_t>(epoch));
    const Dataset shuffled = take_rows(data.train, order);
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t seen = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t begin = step * cfg.global_batch;
      const int64_t b = std::min(cfg.global_batch, train_n - begin);
      const auto sizes = slice_sizes(b, cfg.global_batch, n);
      std::vector<Tensor<float>> xs;
      std::vector<Tensor<int32_t>> ys;
      int64_t at = begin;
      for (int r = 0; r < n; ++r) {
        xs.push_back(slice_rows(shuffled.features, at, at + sizes[r], devices[r]));
        ys.push_back(slice_rows(shuffled.labels, at, at + sizes[r], devices[r]));
        at += sizes[r];
      }
      auto losses = strategy.run(step_fn, PerReplica<Tensor<float>>(xs), PerReplica<Tensor<int32_t>>(ys), b);
      loss_sum += strategy.reduce(ReduceOp::SUM, losses, std::nullopt);
      seen += b;
      if (report) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
        report({epoch, step + 1, steps, loss_sum / static_cast<double>(seen), secs > 0 ? seen / secs : 0, step + 1 == steps});
      }
    }
    result.final_loss = loss_sum / static_cast<double>(seen);
  }
  MlpParams trained{on_host(vars[0].value()), on_host(vars[1].value()), on_host(vars[2].value()),
                    on_host(vars[3].value())};
  result.test_accuracy = mlp_accuracy(trained, data.test.features, data.test.labels);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace digits
