#pragma once
/// \file
/// The training loop of TensorFlow's tutorial "Custom training with tf.distribute.Strategy" on
/// Fashion-MNIST (the fashion_mnist example, its tests): compiled once (train.cpp, the
/// mirrored_fashion library).
///
/// Each step takes the row numbers of a global batch of `batch_per_replica` x replicas examples of
/// the (per-epoch shuffled) training set from `experimental_distribute_dataset`; in `run` every
/// replica gathers its own slice's images and computes the gradients of its share of the loss
/// (cnn.hpp). On one worker Adam's `apply_gradients` then sums them over the replicas and updates
/// in one pass (each replica its slice of every variable); with several workers (or
/// `bucket_bytes` above 0) the backward pass hands them, the last layer's first, to
/// `GradientBuckets`, whose all-reduces (SUM) run while it goes on, and Adam applies the reduced
/// gradients without reducing again. The metrics are the tutorial's: the mean of the
/// steps' losses and the training accuracy (a mirrored SUM variable that every step adds its
/// replicas' loss and correct predictions to, so that a checkpoint holds them), and after every
/// epoch the test set's mean cross-entropy and accuracy (a distributed test step).

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "fashion/fashion_data.hpp"

namespace fashion {

/// The gradient buckets' size with several workers: 64 KiB puts dense_1 and dense in the first
/// bucket, whose all-reduce then overlaps the convolutions' backward pass, and conv2d_1 in the
/// second.
inline constexpr int64_t kDefaultBucketBytes = 64 << 10;

struct TrainConfig {
  int epochs = 10;
  int64_t batch_per_replica = 64;  ///< the tutorial's BATCH_SIZE_PER_REPLICA
  double learning_rate = 0.001;    ///< Adam's (Keras' other defaults)
  double l2 = 1e-5;                ///< Keras' L2 factor of every kernel
  uint64_t seed = 0;               ///< of the initial weights and the shuffling
  /// A safetensors file holding the initial weights under `param_names()` (float32, their shapes),
  /// instead of drawing them from `seed`: to start from another framework's weights
  /// (bench/e2e_fashion.py).
  std::string initial_weights;
  bool shuffle = true;  ///< reshuffle the training set every epoch (the tutorial's shuffle(60000))
  bool shard_optimizer_state = false;
  mirrored::Compression compression = mirrored::Compression::NONE;
  /// Gradient accumulation: each replica cuts its slice of a step into this many micro-batches
  /// (BALANCED, as the strategy cuts a batch into slices), sums their gradients on its device
  /// (optimizers::GradientAccumulator, SUM; the regularisation's gradient once) and applies them
  /// with one step. 1: no accumulation (the gradients go through GradientBuckets instead).
  int accumulate = 1;
  /// How the gradients are reduced when `accumulate` is 1. 0: after the backward pass, by Adam's
  /// `apply_gradients` (SUM), which on one worker fuses the sum with the update: each replica sums
  /// and updates its slice of every variable on its own thread. Above 0: in `GradientBuckets` of
  /// this many bytes, whose all-reduces start during the backward pass on the library's
  /// communication threads (one per replica). Below 0 (the default): 0 on one worker, where the
  /// replica threads have the cores and a communication thread can only take one from a replica
  /// (on the 2-vCPU VM the two ran at the same examples/s within the noise, the fused step with
  /// up to 3 % less CPU and a third of the voluntary context switches), `kDefaultBucketBytes`
  /// with several workers, whose collectives cross processes. Results are bitwise the same either
  /// way.
  int64_t bucket_bytes = -1;
  /// Fault-tolerant training (docs/fault_tolerance.md): a CheckpointManager in this directory
  /// tracks the variables, the optimizer, the input iterator and the epoch's metrics; training
  /// resumes from its newest checkpoint, a PreemptionCheckpointHandler saves and exits with status
  /// 75 on SIGTERM, and the loop saves after epochs 1, 1 + `checkpoint_every_epochs`, ... (the
  /// tutorial's `if epoch % 2 == 0: checkpoint.save(...)`, epochs counted from 0 there) and the last.
  std::string checkpoint_dir;
  int checkpoint_every_epochs = 2;
  /// With `checkpoint_dir`: also save every this many steps (0: only as above and on SIGTERM).
  int64_t save_every_steps = 0;
  int max_to_keep = 3;
  /// Called after every step with the number of steps done (over all epochs and restarts).
  std::function<void(int64_t)> after_step;
};

/// What the tutorial prints after an epoch (accuracies as fractions here).
struct EpochMetrics {
  int epoch = 0;
  double loss = 0;       ///< the mean of the epoch's step losses (regularisation included)
  double accuracy = 0;   ///< training predictions (before each step's update) that were right
  double test_loss = 0;  ///< mean cross-entropy of the test set
  double test_accuracy = 0;
  double train_seconds = 0;  ///< the epoch's steps in this process (input included, the test excluded)
  int64_t examples = 0;      ///< examples those steps trained on
  /// The loss of each step this process ran in the epoch (every replica's share summed, what the
  /// tutorial's `distributed_train_step` returns), in order, from the epoch's step `first_step`
  /// (counted from 1; later than 1 in an epoch this process resumed).
  std::vector<double> step_losses;
  int64_t first_step = 1;
};

struct TrainResult {
  std::vector<mirrored::Variable<float>> variables;  ///< in `param_names()` order
  std::vector<EpochMetrics> epochs;                  ///< those this process finished
  int64_t resumed_at_step = 0;                       ///< with a checkpoint directory: where training resumed
  std::string final_checkpoint;                      ///< with a checkpoint directory: that of the finished training
  double train_seconds = 0;                          ///< every epoch's steps (the tests excluded)
  int64_t examples = 0;                              ///< examples trained on in this process
};

/// Examples `rows` of a split as the tutorial feeds them: images (b, 28, 28, 1) as pixel / 255 in
/// float32 (numpy's `images / np.float32(255)`), labels (b,) int32, on `rows`' device. \throws
/// mirrored::InvalidArgumentError for a row outside the split.
std::tuple<mirrored::Tensor<float>, mirrored::Tensor<int32_t>> gather_examples(const Split& split,
                                                                               const mirrored::Tensor<int64_t>& rows);

/// Trains for `cfg.epochs` epochs on `data.train`, testing on `data.test` after each;
/// `report` is called after each epoch. \throws mirrored::InvalidArgumentError for a batch per
/// replica below 1, `accumulate` outside 1..batch_per_replica or not dividing it, GPU replicas
/// (the model computes on the host), an empty training set, initial weights of another dtype or
/// shape, and as soon as a step's loss is NaN or infinite (training stops there); what
/// `checkpoint::load` throws for the initial weights' file (NotFoundError for it or a tensor it lacks).
TrainResult train(mirrored::Strategy& strategy, const FashionMnist& data, const TrainConfig& cfg,
                  const std::function<void(const EpochMetrics&)>& report = {});

}  // namespace fashion
