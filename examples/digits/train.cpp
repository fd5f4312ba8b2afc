// digits::train, compiled once: the example, the digits tests and the GPU tests all link it.
#include "digits/train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include <mirrored/checkpoint_manager.hpp>
#include <mirrored/gradient_accumulator.hpp>
#include <mirrored/gradient_buckets.hpp>
#include <mirrored/preemption_checkpoint_handler.hpp>

#include "common/rows.hpp"
#include "digits/device_mlp.hpp"

namespace digits {
TrainResult train(mirrored::Strategy& strategy, const Split& data, const TrainConfig& cfg,
                  const std::function<void(const EpochReport&)>& report) {
  using namespace mirrored;
  const auto start = std::chrono::steady_clock::now();
  const int n = strategy.num_replicas_in_sync();
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
      opt = std::make_unique<optimizers::Adam<float>>(
          optimizers::AdamOptions{.learning_rate = cfg.learning_rate > 0 ? cfg.learning_rate : 0.01,
                                  .shard_optimizer_state = cfg.shard_optimizer_state});
    } else if (cfg.optimizer == "sgd") {
      opt = std::make_unique<optimizers::SGD<float>>(
          optimizers::SGDOptions{.learning_rate = cfg.learning_rate > 0 ? cfg.learning_rate : 0.5,
                                 .shard_optimizer_state = cfg.shard_optimizer_state});
    } else {
      throw InvalidArgumentError("--optimizer must be sgd or adam, got '" + cfg.optimizer + "'");
    }
    opt->communication.compression = cfg.compression;
    opt->build(result.variables);
  }
  MIRRORED_ENFORCE(cfg.global_batch >= n, InvalidArgumentError, "global batch ", cfg.global_batch,
                   " must be at least the number of replicas ", n);
  MIRRORED_ENFORCE(cfg.accumulate >= 1 && cfg.global_batch % cfg.accumulate == 0, InvalidArgumentError,
                   "accumulate must be a positive divisor of the global batch ", cfg.global_batch, ", got ",
                   cfg.accumulate);
  auto& vars = result.variables;
  const int64_t train_n = data.train.size();
  const int64_t steps = (train_n + cfg.global_batch - 1) / cfg.global_batch;

  // The model's math: on a CUDA replica on the device (cuBLAS and the example's kernels,
  // device_mlp.hpp), so that per step only the batch goes to the device and the loss comes back;
  // elsewhere Eigen on host memory (a simulated GPU replica brings its batch and weights to the
  // host and sends its gradients back to its device).
  auto on_host = [](const auto& t) { return t.device().is_host() ? t : t.to(cpu0); };

  // One step on one replica: gradients of (sum of its losses) / global batch, all-reduced, then
  // the fused update; returns its loss sum (a scalar on its device). On a device replica the
  // gradients are all-reduced in buckets (the last layer's first, as a backward pass produces them)
  // while its kernels may still run, and the update does not reduce again. On a host replica the
  // gradients all exist once the Eigen backward pass returns, so buckets would overlap nothing:
  // they are scaled in place and the optimizer all-reduces them in one packed collective on the
  // replica thread (no hand-off to a communication thread; the same sums, bit for bit).
  using Batch = std::tuple<Tensor<float>, Tensor<int32_t>>;
  // The gradients of (the summed loss of rows x, y) and that loss sum, on x's device.
  auto loss_and_grads = [&](const Tensor<float>& x, const Tensor<int32_t>& y) {
    const Device& device = x.device();
    if (!device.is_host() && device_mlp_available(device)) {
      const MlpParams p{vars[0].value(), vars[1].value(), vars[2].value(), vars[3].value()};
      DeviceMlpStep s = device_mlp_loss_and_grads(p, x, y);
      return std::make_pair(s.grads.tensors(), cast<double>(s.loss_sum));
    }
    const MlpParams p{on_host(vars[0].value()), on_host(vars[1].value()), on_host(vars[2].value()),
                      on_host(vars[3].value())};
    MlpStep s = mlp_loss_and_grads(p, on_host(x), on_host(y));
    double sum = 0;
    const float* l = s.per_example_loss.data();
    for (int64_t i = 0; i < s.per_example_loss.numel(); ++i) sum += l[i];
    return std::make_pair(s.grads.tensors(), Tensor<double>::scalar(sum));
  };
  // Gradient accumulation (cfg.accumulate > 1): one accumulator for every replica and step.
  optimizers::GradientAccumulator<float> accumulator(ReduceOp::SUM);
  auto accumulated_step = [&](const Tensor<float>& x, const Tensor<int32_t>& y, int64_t global) {
    const int64_t rows = x.shape()[0];
    const int64_t floor = rows / cfg.accumulate, extra = rows % cfg.accumulate;
    Tensor<double> loss;
    int64_t begin = 0;
    for (int j = 0; j < cfg.accumulate; ++j) {
      const int64_t end = begin + floor + (j < extra ? 1 : 0);
      auto [g, l] = loss_and_grads(examples::rows_of(x, begin, end), examples::rows_of(y, begin, end));
      optimizers::GradsAndVars<float> gv;
      for (std::size_t i = 0; i < g.size(); ++i) gv.emplace_back(g[i] / static_cast<float>(global), vars[i]);
      accumulator.accumulate(gv);  // summed on this replica's device, no collective
      loss = j == 0 ? l : loss + l;
      begin = end;
    }
    accumulator.apply_gradients(*opt);  // one all-reduce and one update for the K micro-batches
    return loss;
  };
  auto step_fn = [&](const Batch& batch, int64_t global) {
    const auto& [x, y] = batch;
    const Device& device = x.device();
    if (cfg.accumulate > 1) return accumulated_step(x, y, global);
    auto [g, loss] = loss_and_grads(x, y);
    optimizers::GradsAndVars<float> gv;
    if (device.is_host()) {
      for (std::size_t i = 0; i < g.size(); ++i) {
        as_vector(g[i]) /= static_cast<float>(global);  // fresh tensors of this step: scaled where they are
        gv.emplace_back(std::move(g[i]), vars[i]);
      }
      opt->apply_gradients(gv);
      return loss;
    }
    GradientBuckets<float> buckets(ReduceOp::SUM, opt->communication);
    for (std::size_t i = g.size(); i-- > 0;) {
      const Tensor<float> grad = g[i] / static_cast<float>(global);
      buckets.push(grad.device() == device ? grad : grad.to(device));
    }
    const std::vector<Tensor<float>> reduced = buckets.finish();
    for (std::size_t i = 0; i < g.size(); ++i) gv.emplace_back(reduced[g.size() - 1 - i], vars[i]);
    opt->apply_gradients(gv, /*skip_gradients_aggregation=*/true);
    return loss;
  };

  // The input pipeline shuffles the training set anew each epoch (the same orders for any
  // replica count) and cuts each global batch into the replicas' slices, one step ahead. It
  // shuffles and batches row numbers and gathers each batch's rows in one `map`: the same batches
  // as shuffling and batching the rows themselves (`from_tensor_slices(features, labels)`), without
  // a pair of tensors per row.
  const float* train_x = data.train.features.data();
  const int32_t* train_y = data.train.labels.data();
  const auto dataset =
      data::Dataset<>::range(train_n)
          .shuffle(train_n, cfg.seed)
          .batch(cfg.global_batch)
          .map([train_x, train_y](const Tensor<int64_t>& rows) {
            const int64_t b = rows.numel();
            auto x = Tensor<float>::empty({b, kFeatures});
            auto y = Tensor<int32_t>::empty({b});
            const int64_t* r = rows.data();
            for (int64_t i = 0; i < b; ++i) {
              std::memcpy(x.data() + i * kFeatures, train_x + r[i] * kFeatures, sizeof(float) * kFeatures);
              y.data()[i] = train_y[r[i]];
            }
            return std::make_tuple(x, y);
          });
  // One pass over every epoch: `repeat` reopens the shuffled range, which reshuffles it, so the
  // batches are those of one pass per epoch; one iterator is what a checkpoint can resume.
  const auto dist = strategy.experimental_distribute_dataset(dataset.repeat(cfg.epochs));
  auto input = dist.begin();
  std::optional<checkpoint::CheckpointManager> manager;
  std::optional<PreemptionCheckpointHandler> handler;
  if (!cfg.checkpoint_dir.empty()) {
    manager.emplace(strategy, cfg.checkpoint_dir, cfg.max_to_keep);
    for (auto& v : vars) manager->track(v.name(), v);
    manager->track("optimizer", *opt);
    manager->track("input", input);
    handler.emplace(strategy, *manager, cfg.save_every_steps);  // restores the newest checkpoint
    result.resumed_at_step = handler->total_run_calls();
  }
  auto evaluate = [&] {
    const MlpParams p{on_host(vars[0].value()), on_host(vars[1].value()), on_host(vars[2].value()),
                      on_host(vars[3].value())};
    return mlp_accuracy(p, data.test.features, data.test.labels);
  };
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const auto first_epoch_start = Clock::now();
  int64_t done = result.resumed_at_step;  // steps over all epochs
  for (int epoch = static_cast<int>(done / steps) + 1; epoch <= cfg.epochs; ++epoch) {
    const auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t seen = 0, step = done % steps;
    for (; step < steps; ++step) {
      std::optional<PerReplica<Batch>> batch = input.get_next_as_optional();
      MIRRORED_ENFORCE(batch.has_value(), InternalError, "the input ended at epoch ", epoch, ", step ", step, " of ",
                       steps);
      // This step's global batch (the last one of an epoch may be short); with several workers
      // this worker's replicas hold only their slices of it.
      const int64_t b = std::min(cfg.global_batch, train_n - step * cfg.global_batch);
      auto losses = handler ? handler->run(step_fn, *batch, b) : strategy.run(step_fn, *batch, b);
      const double step_loss = strategy.reduce(ReduceOp::SUM, losses, std::nullopt).item();
      ++done;
      if (cfg.after_step) cfg.after_step(done);
      // Once the loss is NaN or infinite, so are the weights: every further step is wasted.
      MIRRORED_ENFORCE(std::isfinite(step_loss), InvalidArgumentError, "training stopped: the loss became ",
                       std::isnan(step_loss) ? "NaN" : "infinite", " at epoch ", epoch, ", step ", step + 1, " of ",
                       steps, " (diverged; try a smaller learning rate)");
      loss_sum += step_loss;
      seen += b;
      if (report && step + 1 < steps) {
        const double secs = seconds_since(epoch_start);
        report({epoch, step + 1, steps, loss_sum / static_cast<double>(seen), secs > 0 ? seen / secs : 0, false});
      }
    }
    const double epoch_seconds = seconds_since(epoch_start);
    result.train_seconds += epoch_seconds;
    result.examples += seen;
    result.final_loss = seen ? loss_sum / static_cast<double>(seen) : 0;
    if (report) {
      EpochReport last{epoch, step, steps, result.final_loss, epoch_seconds > 0 ? seen / epoch_seconds : 0, true};
      if (cfg.eval_every_epoch) last.test_accuracy = evaluate();
      last.train_seconds = result.train_seconds;
      last.wall_seconds = seconds_since(first_epoch_start);
      report(last);
    }
  }
  if (manager) result.final_checkpoint = manager->save(done);
  result.test_accuracy = evaluate();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace digits
