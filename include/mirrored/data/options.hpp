#pragma once
/// \file
/// `Options` attached to a dataset with `Dataset::with_options` (TF's `tf.data.Options`); today
/// they carry the auto-shard policy used when a dataset is distributed over several input workers.

#include <cstdint>

namespace mirrored::data {

/// How `Strategy::experimental_distribute_dataset` splits a dataset between input workers (TF's
/// `tf.data.experimental.AutoShardPolicy`). Each worker is one input worker: a
/// `MultiWorkerMirroredStrategy` has one per worker, a `MirroredStrategy` one, which reads
/// everything whatever the policy.
enum class AutoShardPolicy {
  /// No sharding: every worker reads the whole dataset.
  OFF = -1,
  /// FILE when the dataset reads files and has at least one file per worker, else DATA.
  AUTO = 0,
  /// Each worker reads only its share of the file list (file `i` goes to worker `i % W`).
  /// Distributing fails when the dataset reads no files or fewer files than workers.
  FILE = 1,
  /// Every worker reads everything and keeps its own replicas' slices of every global batch.
  DATA = 2,
  /// `shard(SHARD_HINT, SHARD_HINT)` placeholders in the dataset become `shard(W, w)`.
  HINT = 3,
};

/// Distribution options of a dataset (TF's `tf.data.experimental.DistributeOptions`).
struct DistributeOptions {
  AutoShardPolicy auto_shard_policy = AutoShardPolicy::AUTO;
};

/// Options of a dataset (TF's `tf.data.Options`).
struct Options {
  DistributeOptions experimental_distribute;
};

/// Placeholder for `shard(SHARD_HINT, SHARD_HINT)` (TF's `tf.data.experimental.SHARD_HINT`): under
/// `AutoShardPolicy::HINT` it means "this input worker's shard"; otherwise the shard is a no-op.
inline constexpr int64_t SHARD_HINT = -1;

/// `prefetch(AUTOTUNE)` (TF's `tf.data.AUTOTUNE`): the library picks the buffer size (2).
inline constexpr int64_t AUTOTUNE = -1;

}  // namespace mirrored::data
