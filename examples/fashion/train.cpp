// fashion::train (train.hpp): the tutorial's custom training loop on mirrored.
#include "fashion/train.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include <mirrored/checkpoint.hpp>
#include <mirrored/checkpoint_manager.hpp>
#include <mirrored/gradient_accumulator.hpp>
#include <mirrored/gradient_buckets.hpp>
#include <mirrored/preemption_checkpoint_handler.hpp>

#include "common/rows.hpp"
#include "fashion/cnn.hpp"

namespace fashion {
namespace {

// Each replica thread's buffers, reused by its training and test steps.
CnnWorkspace<float>& replica_workspace() {
  thread_local CnnWorkspace<float> ws;
  return ws;
}

}  // namespace

std::tuple<mirrored::Tensor<float>, mirrored::Tensor<int32_t>> gather_examples(const Split& split,
                                                                               const mirrored::Tensor<int64_t>& rows) {
  const int64_t b = rows.numel();
  auto x = mirrored::Tensor<float>::empty({b, kImageSide, kImageSide, 1}, rows.device());
  auto y = mirrored::Tensor<int32_t>::empty({b}, rows.device());
  const int64_t* r = rows.data();
  float* out = x.data();
  for (int64_t i = 0; i < b; ++i) {
    MIRRORED_ENFORCE(r[i] >= 0 && r[i] < split.size(), mirrored::InvalidArgumentError, "example ", r[i],
                     " of a split of ", split.size());
    const uint8_t* in = split.images.data() + r[i] * kPixels;
    for (int64_t p = 0; p < kPixels; ++p) out[i * kPixels + p] = static_cast<float>(in[p]) / 255.0f;
    y.data()[i] = split.labels[static_cast<std::size_t>(r[i])];
  }
  return std::make_tuple(x, y);
}

TrainResult train(mirrored::Strategy& strategy, const FashionMnist& data, const TrainConfig& cfg,
                  const std::function<void(const EpochMetrics&)>& report) {
  using namespace mirrored;
  const int n = strategy.num_replicas_in_sync();
  MIRRORED_ENFORCE(cfg.batch_per_replica >= 1, InvalidArgumentError, "the batch per replica must be positive, got ",
                   cfg.batch_per_replica);
  MIRRORED_ENFORCE(
      cfg.accumulate >= 1 && cfg.accumulate <= cfg.batch_per_replica && cfg.batch_per_replica % cfg.accumulate == 0,
      InvalidArgumentError, "accumulate must be a positive divisor of the batch per replica (", cfg.batch_per_replica,
      "), got ", cfg.accumulate);
  MIRRORED_ENFORCE(cfg.epochs >= 1 && cfg.checkpoint_every_epochs >= 1, InvalidArgumentError,
                   "epochs and checkpoint_every_epochs must be positive, got ", cfg.epochs, " and ",
                   cfg.checkpoint_every_epochs);
  for (const Device& d : strategy.extended().worker_devices())
    MIRRORED_ENFORCE(d.is_host(), InvalidArgumentError, "fashion_mnist computes with Eigen in host memory: replica ",
                     d.short_name(), " is not a CPU replica (use CPU:0, CPU:1, ...)");
  const int64_t train_n = data.train.size(), test_n = data.test.size();
  MIRRORED_ENFORCE(train_n > 0, InvalidArgumentError, "the training set is empty");
  const int64_t global_batch = cfg.batch_per_replica * n;
  const int64_t steps = (train_n + global_batch - 1) / global_batch;

  TrainResult result;
  std::unique_ptr<optimizers::Adam<float>> opt;
  // The tutorial's metrics that a step adds to: the steps' summed loss and the correct
  // predictions of the epoch so far (a mirrored variable: every replica's SUM, the same on all).
  std::optional<Variable<double>> train_metrics;
  {
    auto scope = strategy.scope();
    std::vector<Tensor<float>> init;
    const auto names = param_names();
    if (cfg.initial_weights.empty()) {
      init = init_cnn<float>(cfg.seed);
    } else {
      // Written by another framework's safetensors, which carries no mirrored checksum.
      const checkpoint::Checkpoint file = checkpoint::load(cfg.initial_weights, {.require_checksum = false});
      const auto shapes = param_shapes();
      for (std::size_t i = 0; i < names.size(); ++i) init.push_back(file.get<float>(names[i], shapes[i]));
    }
    for (std::size_t i = 0; i < init.size(); ++i)
      result.variables.emplace_back(init[i], VariableOptions{.name = names[i]});
    opt = std::make_unique<optimizers::Adam<float>>(optimizers::AdamOptions{
        .learning_rate = cfg.learning_rate, .shard_optimizer_state = cfg.shard_optimizer_state});
    opt->communication.compression = cfg.compression;
    opt->build(result.variables);
    train_metrics.emplace(Tensor<double>::zeros({2}),
                          VariableOptions{.name = "train_metrics", .aggregation = VariableAggregation::SUM});
  }
  auto& vars = result.variables;
  auto replica_params = [&] {
    std::vector<Tensor<float>> p;
    for (const auto& v : vars) p.push_back(v.value());  // in run: this replica's copies
    return p;
  };

  // Buckets where the all-reduces leave the process; on one worker the replica threads have the
  // cores, and Adam's fused reduction and update needs no communication threads (train.hpp).
  const int64_t bucket_bytes = cfg.bucket_bytes >= 0                   ? cfg.bucket_bytes
                               : strategy.extended().num_workers() > 1 ? kDefaultBucketBytes
                                                                       : 0;
  optimizers::GradientAccumulator<float> accumulator(ReduceOp::SUM);
  // One training step on one replica: its share of the loss of a global batch of `global`
  // examples, whose rows `rows` are its slice; returns nothing (the metrics variable carries the
  // loss and the correct count).
  auto step_fn = [&](const Tensor<int64_t>& rows, int64_t global) {
    // This replica's examples, gathered on its own thread: the input's work is shared evenly.
    const auto [x, y] = gather_examples(data.train, rows);
    CnnWorkspace<float>& ws = replica_workspace();
    const std::vector<Tensor<float>> params = replica_params();
    LossScale scale{global, n, cfg.l2};
    CnnStep<float> total;
    if (cfg.accumulate == 1 && bucket_bytes == 0) {
      // The gradients as the backward pass hands them over, then one apply_gradients that sums
      // them over the replicas and updates (on one worker: each replica its slice, in one pass).
      std::vector<Tensor<float>> grads(kNumParams);
      total =
          cnn_loss_and_grads<float>(params, x, y, scale, ws, [&](int p, Tensor<float> g) { grads[p] = std::move(g); });
      optimizers::GradsAndVars<float> gv;
      for (int p = 0; p < kNumParams; ++p) gv.emplace_back(std::move(grads[p]), vars[p]);
      opt->apply_gradients(gv);
    } else if (cfg.accumulate == 1) {
      CommunicationOptions options = opt->communication;
      options.bytes_per_pack = bucket_bytes;
      GradientBuckets<float> buckets(ReduceOp::SUM, options);
      std::vector<int> order;
      total = cnn_loss_and_grads<float>(params, x, y, scale, ws, [&](int p, Tensor<float> g) {
        buckets.push(std::move(g));  // its bucket's all-reduce may start while the backward pass goes on
        order.push_back(p);
      });
      const std::vector<Tensor<float>> reduced = buckets.finish();
      optimizers::GradsAndVars<float> gv;
      for (std::size_t k = 0; k < order.size(); ++k) gv.emplace_back(reduced[k], vars[order[k]]);
      opt->apply_gradients(gv, /*skip_gradients_aggregation=*/true);
    } else {
      const int64_t rows = x.shape()[0];
      for (int j = 0; j < cfg.accumulate; ++j) {
        const int64_t begin = examples::micro_batch_begin(rows, cfg.accumulate, j);
        const int64_t end = examples::micro_batch_begin(rows, cfg.accumulate, j + 1);
        std::vector<Tensor<float>> grads(kNumParams);
        const CnnStep<float> part =
            cnn_loss_and_grads<float>(params, examples::rows_of(x, begin, end), examples::rows_of(y, begin, end), scale,
                                      ws, [&](int p, Tensor<float> g) { grads[p] = std::move(g); });
        scale.l2 = 0;  // the regularisation's loss and gradient once per step
        optimizers::GradsAndVars<float> gv;
        for (int p = 0; p < kNumParams; ++p) gv.emplace_back(std::move(grads[p]), vars[p]);
        accumulator.accumulate(gv);  // summed on this replica, no collective
        total.loss += part.loss;
        total.correct += part.correct;
      }
      accumulator.apply_gradients(*opt);  // one all-reduce and one update for the micro-batches
    }
    const Device& device = x.device();
    train_metrics->assign_add(Tensor<double>::from_vector(
        {static_cast<double>(total.loss), static_cast<double>(total.correct)}, {2}, device));
  };
  // The tutorial's test step: the batch's summed cross-entropy and correct predictions.
  auto test_fn = [&](const Tensor<int64_t>& rows) {
    const auto [x, y] = gather_examples(data.test, rows);
    const CnnEval e = cnn_evaluate<float>(replica_params(), x, y, replica_workspace());
    return Tensor<double>::from_vector({e.loss_sum, static_cast<double>(e.correct)}, {2}, x.device());
  };

  // The input: the training set reshuffled every epoch (one pass per epoch through `repeat`, one
  // iterator a checkpoint can resume), the test set in order; each global batch cut into the
  // replicas' slices, one step ahead. Only row numbers go through the pipeline: each replica
  // gathers its slice's images in its step (`gather_examples`), so that work is shared evenly
  // rather than done on the prefetch thread, which would take a core from one replica (both
  // replica threads compute all the time).
  auto train_rows = data::Dataset<>::range(train_n);
  if (cfg.shuffle) train_rows = train_rows.shuffle(train_n, cfg.seed);
  const auto dist_train = strategy.experimental_distribute_dataset(train_rows.batch(global_batch).repeat(cfg.epochs));
  const auto dist_test = strategy.experimental_distribute_dataset(data::Dataset<>::range(test_n).batch(global_batch));
  auto input = dist_train.begin();

  std::optional<checkpoint::CheckpointManager> manager;
  std::optional<PreemptionCheckpointHandler> handler;
  int reported = 0;  // epochs whose line was printed (by this run or an earlier one)
  if (!cfg.checkpoint_dir.empty()) {
    manager.emplace(strategy, cfg.checkpoint_dir, cfg.max_to_keep);
    for (auto& v : vars) manager->track(v.name(), v);
    manager->track("optimizer", *opt);
    manager->track("input", input);
    manager->track("train_metrics", *train_metrics);
    manager->set_metadata("reported_epoch", "0");
    handler.emplace(strategy, *manager, cfg.save_every_steps);  // restores the newest checkpoint
    result.resumed_at_step = handler->total_run_calls();
    if (const auto r = manager->metadata("reported_epoch")) reported = std::stoi(*r);
  }

  auto test = [&](EpochMetrics& m) {
    double loss = 0, correct = 0;
    for (auto it = dist_test.begin();;) {
      std::optional<PerReplica<Tensor<int64_t>>> batch = it.get_next_as_optional();
      if (!batch) break;
      const auto sums = strategy.reduce(ReduceOp::SUM, strategy.run(test_fn, *batch), std::nullopt).to_vector();
      loss += sums[0];
      correct += sums[1];
    }
    m.test_loss = test_n ? loss / static_cast<double>(test_n) : 0;
    m.test_accuracy = test_n ? correct / static_cast<double>(test_n) : 0;
  };

  using Clock = std::chrono::steady_clock;
  int64_t done = result.resumed_at_step;  // steps over all epochs
  for (int epoch = reported + 1; epoch <= cfg.epochs; ++epoch) {
    EpochMetrics m;
    m.epoch = epoch;
    const auto start = Clock::now();
    double loss_before = train_metrics->value().to_vector()[0];  // a resumed epoch's steps so far
    // From where the checkpoint left off: a resumed epoch may have steps done, or all of them
    // (saved after its last step but before its line was printed).
    m.first_step = done - static_cast<int64_t>(epoch - 1) * steps + 1;
    for (int64_t step = m.first_step - 1; step < steps; ++step) {
      std::optional<PerReplica<Tensor<int64_t>>> batch = input.get_next_as_optional();
      MIRRORED_ENFORCE(batch.has_value(), InternalError, "the input ended at epoch ", epoch, ", step ", step, " of ",
                       steps);
      // This step's global batch (an epoch's last may be short); with several workers this
      // worker's replicas hold only their slices of it.
      const int64_t b = std::min(global_batch, train_n - step * global_batch);
      if (handler)
        handler->run(step_fn, *batch, b);
      else
        strategy.run(step_fn, *batch, b);
      ++done;
      m.examples += b;
      if (cfg.after_step) cfg.after_step(done);
      // Once the loss is NaN or infinite, so are the weights: every further step is wasted.
      const double loss_total = train_metrics->value().to_vector()[0];
      // The step's loss: the total's increment (exact to about 1e-16 of the total, far below the
      // float32 losses it sums).
      m.step_losses.push_back(loss_total - loss_before);
      loss_before = loss_total;
      MIRRORED_ENFORCE(std::isfinite(loss_total), InvalidArgumentError, "training stopped: the loss became ",
                       std::isnan(loss_total) ? "NaN" : "infinite", " at epoch ", epoch, ", step ", step + 1, " of ",
                       steps, " (diverged; try a smaller learning rate)");
    }
    m.train_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.train_seconds += m.train_seconds;
    result.examples += m.examples;
    const std::vector<double> totals = train_metrics->value().to_vector();
    m.loss = totals[0] / static_cast<double>(steps);
    m.accuracy = totals[1] / static_cast<double>(train_n);
    test(m);
    if (report) report(m);
    result.epochs.push_back(m);
    // The epoch is reported: its metrics start again, and a checkpoint from here on says so.
    train_metrics->assign(Tensor<double>::zeros({2}));
    if (manager) {
      manager->set_metadata("reported_epoch", std::to_string(epoch));
      if ((epoch - 1) % cfg.checkpoint_every_epochs == 0 && epoch < cfg.epochs) manager->save(done);
    }
  }
  // The finished training (also when a restart found it finished: saving a step again replaces it).
  if (manager) result.final_checkpoint = manager->save(done);
  return result;
}

}  // namespace fashion
