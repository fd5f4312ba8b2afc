// The non-template parts of distributed input: option checks, the auto-shard decision, the
// per-replica element spec, and the checks on each global batch.
#include <atomic>
#include <string>

#include "mirrored/detail/format.hpp"
#include "mirrored/distributed_dataset.hpp"
#include "util/log.hpp"

namespace mirrored::data::detail {
namespace {

const char* policy_name(AutoShardPolicy p) {
  switch (p) {
    case AutoShardPolicy::OFF: return "OFF";
    case AutoShardPolicy::AUTO: return "AUTO";
    case AutoShardPolicy::FILE: return "FILE";
    case AutoShardPolicy::DATA: return "DATA";
    case AutoShardPolicy::HINT: return "HINT";
  }
  return "?";
}

ShardPlan file_sharding(const GraphInfo& info, int num_workers, int worker_index) {
  ShardPlan plan;
  plan.ctx = OpenContext{num_workers, worker_index, true, false, {}};
  plan.keep_own_slices = false;
  MIRRORED_LOG(info, "experimental_distribute_dataset: FILE sharding, worker ", worker_index, " of ", num_workers,
               " reads every ", num_workers, "th of ", *info.num_files, " files");
  return plan;
}

}  // namespace

void check_input_options(const InputOptions& o, bool from_function) {
  MIRRORED_ENFORCE(o.experimental_per_replica_buffer_size >= 0, InvalidArgumentError,
                   "InputOptions: experimental_per_replica_buffer_size must be >= 0 (got ",
                   o.experimental_per_replica_buffer_size, ")");
  MIRRORED_ENFORCE(from_function || o.experimental_replication_mode == InputReplicationMode::PER_WORKER,
                   InvalidArgumentError,
                   "InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function`");
}

void check_workers(int num_workers, int worker_index, std::size_t local_replicas) {
  MIRRORED_ENFORCE(num_workers >= 1, InvalidArgumentError, "distributed input: num_workers must be >= 1 (got ",
                   num_workers, ")");
  MIRRORED_ENFORCE(0 <= worker_index && worker_index < num_workers, InvalidArgumentError,
                   "distributed input: worker_index ", worker_index, " out of range for ", num_workers, " workers");
  MIRRORED_ENFORCE(local_replicas >= 1, InvalidArgumentError, "distributed input: a worker needs at least one replica");
}

ShardPlan resolve_sharding(const GraphInfo& info, int num_workers, int worker_index) {
  if (num_workers == 1) return ShardPlan{};
  const AutoShardPolicy policy = info.options.experimental_distribute.auto_shard_policy;
  const bool has_files = info.num_files.has_value();
  const bool enough_files = has_files && *info.num_files >= static_cast<std::size_t>(num_workers);
  switch (policy) {
    case AutoShardPolicy::OFF: return ShardPlan{OpenContext{num_workers, worker_index, false, false, {}}, false};
    case AutoShardPolicy::HINT: return ShardPlan{OpenContext{num_workers, worker_index, false, true, {}}, false};
    case AutoShardPolicy::FILE:
      MIRRORED_ENFORCE(
          has_files, InvalidArgumentError,
          "AutoShardPolicy::FILE: the dataset reads no files (its source is not fixed_length_record_dataset "
          "or text_line_dataset); use AutoShardPolicy::DATA or OFF");
      MIRRORED_ENFORCE(enough_files, InvalidArgumentError, "AutoShardPolicy::FILE: the dataset reads ", *info.num_files,
                       " files, fewer than the ", num_workers,
                       " input workers (each needs at least one file); use AutoShardPolicy::DATA or OFF");
      return file_sharding(info, num_workers, worker_index);
    case AutoShardPolicy::AUTO:
      if (enough_files) return file_sharding(info, num_workers, worker_index);
      if (has_files) {
        MIRRORED_LOG(warn, "experimental_distribute_dataset: AUTO sharding falls back to DATA: ", *info.num_files,
                     " files for ", num_workers, " input workers");
      }
      return ShardPlan{OpenContext{num_workers, worker_index, false, false, {}}, true};
    case AutoShardPolicy::DATA: return ShardPlan{OpenContext{num_workers, worker_index, false, false, {}}, true};
  }
  throw InvalidArgumentError(std::string("unknown AutoShardPolicy ") + policy_name(policy));
}

void check_spec_splittable(const std::vector<TensorSpec>& spec, int num_slices) {
  for (std::size_t c = 0; c < spec.size(); ++c) {
    MIRRORED_ENFORCE(spec[c].rank() != 0, InvalidArgumentError,
                     "experimental_distribute_dataset: the elements of the "
                     "dataset are not batched (component ",
                     c, " has rank 0, shape ()), so they cannot be split between ", num_slices,
                     " replicas; batch the dataset first: dataset.batch(global_batch_size)");
  }
}

std::vector<TensorSpec> per_replica_spec(std::vector<TensorSpec> spec, const GraphInfo& info, int num_slices) {
  if (num_slices == 1) return spec;
  for (TensorSpec& s : spec) {
    if (!s.known_rank || s.shape.empty()) continue;
    const bool even =
        info.drop_remainder && info.batch_size && s.shape[0] == *info.batch_size && *info.batch_size % num_slices == 0;
    s.shape[0] = even ? *info.batch_size / num_slices : -1;
  }
  return spec;
}

int64_t check_splittable(const std::vector<UntypedTensor>& batch, int num_slices) {
  for (std::size_t c = 0; c < batch.size(); ++c) {
    MIRRORED_ENFORCE(!batch[c].shape.empty(), InvalidArgumentError,
                     "experimental_distribute_dataset: an element of the "
                     "dataset is not batched (component ",
                     c, " has rank 0, shape ()), so it cannot be split between ", num_slices,
                     " replicas; batch the dataset first: dataset.batch(global_batch_size)");
    MIRRORED_ENFORCE(batch[c].shape[0] == batch[0].shape[0], InvalidArgumentError,
                     "experimental_distribute_dataset: the components of a batch differ in their first dimension: "
                     "component 0 has shape ",
                     ::mirrored::detail::format_shape(batch[0].shape), ", component ", c, " has shape ",
                     ::mirrored::detail::format_shape(batch[c].shape));
  }
  return batch[0].shape[0];
}

void write_placement(StateWriter& w, const IteratorPlacement& p) {
  w.i64(p.num_workers);
  w.i64(p.worker_index);
  w.i64(p.local_replicas);
  w.i64(p.replicas_in_sync);
}

void check_placement(StateReader& r, const IteratorPlacement& current) {
  IteratorPlacement saved;
  saved.num_workers = r.i64();
  saved.worker_index = r.i64();
  saved.local_replicas = r.i64();
  saved.replicas_in_sync = r.i64();
  std::string diff;
  const auto add = [&](const std::string& part) { diff += (diff.empty() ? "" : "; ") + part; };
  using ::mirrored::detail::str_cat;
  if (saved.num_workers != current.num_workers)
    add(str_cat("saved with ", saved.num_workers, " input workers, restoring into ", current.num_workers));
  if (saved.worker_index != current.worker_index)
    add(str_cat("saved as worker ", saved.worker_index, ", restoring as worker ", current.worker_index));
  if (saved.replicas_in_sync != current.replicas_in_sync)
    add(str_cat("saved with ", saved.replicas_in_sync, " replicas in sync, restoring into ", current.replicas_in_sync));
  if (saved.local_replicas != current.local_replicas)
    add(str_cat("saved with ", saved.local_replicas, " local replicas, restoring into ", current.local_replicas));
  MIRRORED_ENFORCE(diff.empty(), InvalidArgumentError, r.op(), ": ", diff,
                   " (an iterator resumes only where it was saved: the same workers and replicas)");
}

void warn_dropped_partial_step(std::size_t have, std::size_t replicas) {
  MIRRORED_LOG(warn, "distribute_datasets_from_function: the last step had elements for only ", have, " of ", replicas,
               " replicas; they have rank 0, so no empty batch can stand in for the missing ones, and the step was "
               "dropped (batch the datasets to keep every element)");
}

bool paddable(const std::vector<TensorSpec>& spec) {
  for (const TensorSpec& s : spec)
    if (s.known_rank && s.shape.empty()) return false;
  return true;
}

std::vector<UntypedTensor> empty_batch(const std::vector<TensorSpec>& spec, const std::vector<Shape>& seen,
                                       const Device& dst) {
  std::vector<UntypedTensor> out;
  out.reserve(spec.size());
  for (std::size_t c = 0; c < spec.size(); ++c) {
    const Shape* like = c < seen.size() && !seen[c].empty() ? &seen[c] : nullptr;
    Shape shape;
    if (spec[c].known_rank) {
      shape = spec[c].shape;
      for (std::size_t d = 1; d < shape.size(); ++d) {
        if (shape[d] < 0) shape[d] = like && like->size() == shape.size() ? (*like)[d] : 0;
      }
    } else {
      shape = like ? *like : Shape{0};
    }
    shape.at(0) = 0;  // paddable(spec): rank 1 at least
    out.push_back(::mirrored::detail::make_untyped(spec[c].dtype, shape, dst));
  }
  return out;
}

void warn_dropped_worker_step(int worker_index) {
  MIRRORED_LOG(warn, "distributed input: worker ", worker_index,
               " dropped its remaining steps: another worker's input has ended and the elements have rank 0, so no "
               "empty batch can stand in for them (batch the dataset to keep every element)");
}

}  // namespace mirrored::data::detail
