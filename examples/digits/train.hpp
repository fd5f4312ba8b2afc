#pragma once
// Distributed training of the digits MLP with MirroredStrategy: the loop the train_digits
// example runs and the equivalence test checks. Example code, compiled once (train.cpp, the
// mirrored_digits library) for the example, its tests and the GPU tests.
//
// Each step takes a global batch of the (per-epoch shuffled) training set from
// experimental_distribute_dataset, which cuts it into one consecutive slice per replica (the
// first G % N replicas get one more example; in a final partial batch trailing replicas may get
// none), and in `run` every replica computes the
// gradients of its slice's summed loss divided by the global batch size; the optimizer
// all-reduces them (SUM), so every replica applies the gradient of the global batch's mean loss.
// Only the order of the sums differs between replica counts.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "digits_data.hpp"

namespace digits {

struct TrainConfig {
  int epochs = 20;
  int64_t global_batch = 32;
  std::string optimizer = "sgd";  // "sgd" or "adam"
  double learning_rate = 0;       // 0: the optimizer's default here (sgd 0.5, adam 0.01)
  uint64_t seed = 0;
  double test_fraction = 0.2;
  /// Evaluate the held-out set after every epoch (EpochReport::test_accuracy of the epoch's last
  /// report); outside the training loop's time.
  bool eval_every_epoch = false;
  /// The optimizer keeps each replica's slice of its slots only (shard_optimizer_state).
  bool shard_optimizer_state = false;
  /// How the gradients cross workers (CommunicationOptions::compression).
  mirrored::Compression compression = mirrored::Compression::NONE;
  /// Gradient accumulation: each replica cuts its slice of a step's batch into this many
  /// micro-batches (by the BALANCED rule, as the strategy cuts a batch into replica slices),
  /// sums their gradients on its device (optimizers::GradientAccumulator, SUM: each is already
  /// scaled by the global batch size) and applies them with one step. 1: no accumulation.
  int accumulate = 1;
  /// Fault-tolerant training (docs/fault_tolerance.md): when set, a CheckpointManager in this
  /// directory tracks the variables, the optimizer (slots and step counter) and the input
  /// iterator; training resumes from its newest checkpoint, a PreemptionCheckpointHandler saves
  /// and exits with status 75 on SIGTERM, and the finished training is saved there too.
  std::string checkpoint_dir;
  /// With `checkpoint_dir`: also save every this many steps (0: only on SIGTERM and at the end).
  int64_t save_every_steps = 0;
  /// With `checkpoint_dir`: checkpoints kept.
  int max_to_keep = 3;
  /// Called after every step with the number of steps done (over all epochs and restarts);
  /// train_digits' test hook raises a signal here.
  std::function<void(int64_t)> after_step;
};

/// What one epoch reports (for progress output).
struct EpochReport {
  int epoch = 0;
  int64_t step = 0, steps = 0;
  double mean_loss = 0;  // mean per-example loss of the epoch so far
  double examples_per_s = 0;
  bool done = false;  // last step of the epoch (reported once the epoch's pass is over)
  // Only in the last report of an epoch (done):
  double test_accuracy = -1;  // held-out accuracy after the epoch with TrainConfig::eval_every_epoch, else -1
  double train_seconds = 0;   // the training loop so far: every epoch's steps, input included, evaluations excluded
  double wall_seconds = 0;    // since the first epoch began, evaluations included
};

struct TrainResult {
  std::vector<mirrored::Variable<float>> variables;  // dense/kernel, dense/bias, dense_1/kernel, dense_1/bias
  double test_accuracy = 0;
  double final_loss = 0;
  double seconds = 0;            // all of train(): building the model and the final evaluation included
  double train_seconds = 0;      // the training loop only (as EpochReport::train_seconds)
  int64_t examples = 0;          // examples trained on, over all epochs (since the resume, if any)
  int64_t resumed_at_step = 0;   // with TrainConfig::checkpoint_dir: the step training resumed from
  std::string final_checkpoint;  // with TrainConfig::checkpoint_dir: the checkpoint of the finished training
};

/// Trains for `cfg.epochs` epochs; `report` is called after every step.
/// \throws mirrored::InvalidArgumentError for a bad optimizer name, a global batch smaller than
/// the number of replicas, `accumulate` < 1 or a global batch it does not divide, and as soon as a
/// step's loss is NaN or infinite (training stops there).
TrainResult train(mirrored::Strategy& strategy, const Split& data, const TrainConfig& cfg,
                  const std::function<void(const EpochReport&)>& report = {});

}  // namespace digits
