#pragma once
/// \file
/// Options of distributed input (`InputOptions`, TF's `tf.distribute.InputOptions`) and the
/// `InputContext` handed to `Strategy::distribute_datasets_from_function`'s function.

#include <cstdint>

#include "mirrored/errors.hpp"

namespace mirrored {

/// How `distribute_datasets_from_function` creates datasets (TF's
/// `tf.distribute.InputReplicationMode`).
enum class InputReplicationMode {
  /// One dataset per input worker; its elements are dealt round-robin to the worker's replicas.
  PER_WORKER,
  /// One dataset per replica; replica r reads only its own (only for
  /// `distribute_datasets_from_function`).
  PER_REPLICA,
};

/// How `experimental_distribute_dataset` cuts a global batch of `b` elements into one slice per
/// replica (N replicas in sync).
enum class RebatchPolicy {
  /// Every batch of b rows, full or partial, is cut as evenly as possible: `floor = b / N` rows
  /// per slice and one more for the first `b - N*floor` slices (for a full batch, TF's
  /// `batch_sizes_for_worker`). A replica gets an empty (0-row) batch only when the batch has
  /// fewer than N rows.
  BALANCED,
  /// Slice r gets rows `[r*c, (r+1)*c)` of the batch, clipped to its `b` rows, with
  /// `c = ceil(b / N)` (TF's in-memory AUTO rule): trailing slices may be shorter or empty.
  CEIL,
};

/// Options of `experimental_distribute_dataset` / `distribute_datasets_from_function`.
struct InputOptions {
  /// Copy each replica's part to that replica's device (for CPU replicas: host memory tagged
  /// with the replica's device); false leaves it where the pipeline made it (host, `CPU:0`).
  bool experimental_fetch_to_device = true;
  /// PER_REPLICA is only allowed for `distribute_datasets_from_function`.
  InputReplicationMode experimental_replication_mode = InputReplicationMode::PER_WORKER;
  /// Steps the iterator's background thread keeps ready (each holds one element per replica); it
  /// works on the next one meanwhile. 0: no background thread, each step is prepared inside
  /// `get_next`. Must be >= 0.
  int experimental_per_replica_buffer_size = 1;
  /// The split rule of `experimental_distribute_dataset`.
  RebatchPolicy rebatch_policy = RebatchPolicy::BALANCED;
};

/// What the dataset function of `distribute_datasets_from_function` learns about where its
/// dataset is used (TF's `tf.distribute.InputContext`; public read-only fields).
struct InputContext {
  /// Number of datasets the function is called for (input workers in PER_WORKER mode, replicas
  /// in PER_REPLICA mode).
  int num_input_pipelines = 1;
  /// Which of them this call makes, `0 <= input_pipeline_id < num_input_pipelines`.
  int input_pipeline_id = 0;
  /// Replicas that consume a step together (over all workers).
  int num_replicas_in_sync = 1;

  /// One pipeline, one replica.
  InputContext() = default;
  /// \throws InvalidArgumentError unless `num_input_pipelines >= 1`,
  /// `0 <= input_pipeline_id < num_input_pipelines` and `num_replicas_in_sync >= 1`.
  InputContext(int num_input_pipelines_, int input_pipeline_id_, int num_replicas_in_sync_)
      : num_input_pipelines(num_input_pipelines_),
        input_pipeline_id(input_pipeline_id_),
        num_replicas_in_sync(num_replicas_in_sync_) {
    MIRRORED_ENFORCE(num_input_pipelines >= 1 && 0 <= input_pipeline_id && input_pipeline_id < num_input_pipelines,
                     InvalidArgumentError, "InputContext: input_pipeline_id ", input_pipeline_id, " out of range for ",
                     num_input_pipelines, " input pipelines");
    MIRRORED_ENFORCE(num_replicas_in_sync >= 1, InvalidArgumentError,
                     "InputContext: num_replicas_in_sync must be >= 1 (got ", num_replicas_in_sync, ")");
  }

  /// The batch each replica should get for a global batch of `global_batch_size`.
  /// \throws InvalidArgumentError when it is not divisible: "The `global_batch_size` 7 is not
  /// divisible by `num_replicas_in_sync` 2".
  int64_t get_per_replica_batch_size(int64_t global_batch_size) const {
    MIRRORED_ENFORCE(global_batch_size % num_replicas_in_sync == 0, InvalidArgumentError, "The `global_batch_size` ",
                     global_batch_size, " is not divisible by `num_replicas_in_sync` ", num_replicas_in_sync);
    return global_batch_size / num_replicas_in_sync;
  }
};

}  // namespace mirrored
