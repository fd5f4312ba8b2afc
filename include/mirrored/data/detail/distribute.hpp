#pragma once
/// \file
/// Internal: how a distributed dataset is set up for one worker -- the state its iterators share,
/// auto-sharding, the placement a saved iterator state records, the agreement of several input
/// workers on the end of their input, and the entry points of
/// `Strategy::experimental_distribute_dataset` and `distribute_datasets_from_function`.
/// Needed by <mirrored/distributed_dataset.hpp>, which defines the dataset and iterator types.

#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include "mirrored/data/dataset.hpp"
#include "mirrored/data/detail/step_sources.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/input_options.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored {

template <class E>
class DistributedDataset;

namespace data::detail {

/// How the input workers of a multi-worker strategy agree, step by step, on the end of their
/// input (TF's rule for several workers: a worker whose data has ended gets empty batches until
/// every worker's has). Given by the strategy, which owns the cross-worker path (the data layer
/// sits below it); empty with one worker, where nothing is exchanged.
struct InputAgreement {
  /// Collective across the workers, on the caller's thread: how many workers have another step
  /// (`mine`: whether this worker has). \throws what a cross-worker collective throws.
  std::function<int(bool mine)> count_with_input;
  /// This worker's pipeline failed: the others, which wait in `count_with_input`, are told.
  std::function<void(const std::exception_ptr&)> input_failed;
  explicit operator bool() const noexcept { return static_cast<bool>(count_with_input); }
};

/// False when a component of `spec` has rank 0: no empty batch can stand in for such elements.
bool paddable(const std::vector<TensorSpec>& spec);
/// The components of an empty (0-row) batch, on `dst`, standing in for a step of a worker whose
/// input has ended (`paddable(spec)`): the dtypes and the dimensions after the first of `spec`;
/// a dimension (or rank) the spec leaves unknown is taken from `seen` (the shapes of this
/// worker's last element; empty when it had none), else 0 (TF's dummy batches do the same).
std::vector<UntypedTensor> empty_batch(const std::vector<TensorSpec>& spec, const std::vector<Shape>& seen,
                                       const Device& dst);
/// Warns (once per pass) that worker `worker_index` dropped a step because another worker's input
/// ended and its elements have rank 0 (no empty batch can stand in for them).
void warn_dropped_worker_step(int worker_index);

/// Everything a distributed dataset needs to start a pass; shared by its copies and iterators.
template <class E>
struct DistributedState {
  using Source = std::shared_ptr<StepSource<E>>;
  std::function<Source(std::stop_token)> open;                   // a new pass (cancelled through the token)
  std::function<Source(std::stop_token, StateReader&)> restore;  // a pass positioned by saved state
  std::vector<TensorSpec> replica_spec;                          // per-replica element spec (components)
  std::size_t num_local_replicas = 1;
  int buffer_size = 1;  // steps kept ready (0: none, no thread)
  // What iterator state checks a restore against.
  int num_workers = 1, worker_index = 0;
  std::string distribution;           // the entry point and the split parameters
  std::vector<NodePtr<E>> pipelines;  // the datasets read, in order
  // Several workers: the end-of-input agreement, and where empty batches go (replica r's device
  // when fetching to devices, else the host).
  InputAgreement agreement;
  std::vector<Device> devices;
  bool fetch_to_device = true;
  // Resuming a pass saved on another placement (`DistributedIterator::restore_state` of every
  // saved worker's state). Set only when each worker's position follows from the global one
  // (DATA sharding, or one worker): a source restored from a saved worker's state that goes on
  // with the next global batch, and the step this worker takes from a global batch. Otherwise
  // `not_resumable_elsewhere` says why not.
  std::function<Source(std::stop_token, StateReader&)> restore_regrouped;
  std::function<std::vector<E>(const std::vector<UntypedTensor>&)> worker_step;
  std::string not_resumable_elsewhere;
};

/// \throws InvalidArgumentError for a negative buffer size, or PER_REPLICA when `from_function`
/// is false.
void check_input_options(const InputOptions& o, bool from_function);
/// \throws InvalidArgumentError unless `num_workers >= 1`, `0 <= worker_index < num_workers`
/// and there is at least one local replica.
void check_workers(int num_workers, int worker_index, std::size_t local_replicas);

/// Where a distributed iterator runs, as its saved state records it.
struct IteratorPlacement {
  int64_t num_workers = 1, worker_index = 0, local_replicas = 1, replicas_in_sync = 1;
};
void write_placement(StateWriter& w, const IteratorPlacement& p);
/// Reads a placement and compares it with `current`. \throws InvalidArgumentError naming both
/// sides of every difference ("saved with 2 replicas in sync, restoring into 4").
void check_placement(StateReader& r, const IteratorPlacement& current);

/// "2 workers x 3 replicas".
std::string describe_placement(const IteratorPlacement& p);

/// A distributed iterator's saved state, read up to its pass (the part each source writes).
struct SavedIteratorState {
  IteratorPlacement placement;
  std::string pipeline;                 // the distribution and the pipelines' description
  std::vector<uint64_t> counters;       // the pipelines' shuffle pass counters
  std::optional<uint64_t> steps_taken;  // in the pass (format version 2 on)
  std::string pass;
};
/// Reads what `DistributedIterator::save_state` wrote. \throws InvalidArgumentError ("<op>:
/// corrupt iterator state: ...") when the bytes are no such state.
SavedIteratorState read_saved_state(const std::string& bytes, const std::string& op);
/// Checks that `saved` are the states of every worker of one placement, worker k's at index k,
/// all at the same step of their pass. \throws InvalidArgumentError naming what differs.
void check_saved_workers(const std::vector<SavedIteratorState>& saved, const std::string& op);

/// The auto-shard decision for one worker.
struct ShardPlan {
  OpenContext ctx;              // file / hint sharding applied when the worker's pass is opened
  bool keep_own_slices = true;  // DATA: keep this worker's slices of every global batch
};
/// Empty when a pass of a worker sharded by `plan` resumes on another placement (DATA, or one
/// worker); else why not (FILE, HINT, OFF: each worker's position is its own).
std::string why_not_resumable_elsewhere(const ShardPlan& plan);
/// Applies the dataset's `AutoShardPolicy` for worker `worker_index` of `num_workers` (one worker:
/// nothing to shard). \throws InvalidArgumentError under FILE when the dataset reads no files or
/// fewer files than there are workers.
ShardPlan resolve_sharding(const GraphInfo& info, int num_workers, int worker_index);
/// \throws InvalidArgumentError when the elements are known to be rank-0 and `num_slices > 1`.
void check_spec_splittable(const std::vector<TensorSpec>& spec, int num_slices);
/// Each replica's element spec after the split: the first dimension becomes `G / N` when every
/// slice is known to have that size (`batch(G, drop_remainder=true)` with N dividing G), else -1.
std::vector<TensorSpec> per_replica_spec(std::vector<TensorSpec> spec, const GraphInfo& info, int num_slices);

/// The internal entry point of `experimental_distribute_dataset`: `devices` are this worker's
/// replicas (R of them); `num_workers` input workers with R replicas each consume a step together
/// (N = W*R replicas in sync); this process is `worker_index`. Strategies with one worker pass (1, 0).
template <class E>
DistributedDataset<E> distribute_dataset(const Dataset<E>& ds, std::vector<Device> devices, int num_workers,
                                         int worker_index, const InputOptions& o, InputAgreement agreement = {}) {
  check_input_options(o, false);
  check_workers(num_workers, worker_index, devices.size());
  const NodePtr<E>& node = ds.node();
  const int n = num_workers * static_cast<int>(devices.size());
  const ShardPlan shard = resolve_sharding(node->info(), num_workers, worker_index);
  if (n > 1) check_spec_splittable(node->spec(), n);

  SplitPlan plan;
  plan.num_workers = num_workers;
  plan.worker_index = worker_index;
  plan.devices = std::move(devices);
  plan.fetch_to_device = o.experimental_fetch_to_device;
  plan.policy = o.rebatch_policy;
  plan.keep_own_slices = shard.keep_own_slices;
  plan.pass_through = n == 1;

  auto state = std::make_shared<DistributedState<E>>();
  state->replica_spec = per_replica_spec(node->spec(), node->info(), n);
  state->num_local_replicas = plan.devices.size();
  state->buffer_size = o.experimental_per_replica_buffer_size;
  state->num_workers = num_workers;
  state->worker_index = worker_index;
  state->distribution = ::mirrored::detail::str_cat(
      "experimental_distribute_dataset(rebatch_policy=", static_cast<int>(plan.policy),
      ", keep_own_slices=", plan.keep_own_slices, ", shard_files=", shard.ctx.shard_files,
      ", shard_hint=", shard.ctx.shard_hint, ", fetch_to_device=", plan.fetch_to_device, ")");
  state->pipelines = {node};
  if (num_workers > 1) state->agreement = std::move(agreement);
  state->devices = plan.devices;
  state->fetch_to_device = plan.fetch_to_device;
  state->open = [node, ctx = shard.ctx, plan](std::stop_token stop) -> typename DistributedState<E>::Source {
    OpenContext pass = ctx;
    pass.stop = std::move(stop);
    return std::make_shared<RebatchSource<E>>(node->open(pass), plan, pass.stop);
  };
  state->restore = [node, ctx = shard.ctx, plan](std::stop_token stop, StateReader& r) ->
      typename DistributedState<E>::Source {
        OpenContext pass = ctx;
        pass.stop = std::move(stop);
        return RebatchSource<E>::restore(*node, pass, plan, r);
      };
  state->not_resumable_elsewhere = why_not_resumable_elsewhere(shard);
  if (state->not_resumable_elsewhere.empty()) {
    state->restore_regrouped = [node, ctx = shard.ctx, plan](std::stop_token stop, StateReader& r) ->
        typename DistributedState<E>::Source {
          OpenContext pass = ctx;
          pass.stop = std::move(stop);
          return RebatchSource<E>::restore(*node, pass, plan, r, /*regroup=*/true);
        };
    state->worker_step = [plan](const std::vector<UntypedTensor>& batch) {
      return RebatchSource<E>::worker_step(plan, batch);
    };
  }
  return DistributedDataset<E>(std::move(state));
}

template <class X>
inline constexpr bool is_dataset_v = false;
template <class E>
inline constexpr bool is_dataset_v<Dataset<E>> = true;

/// The internal entry point of `distribute_datasets_from_function` (arguments as
/// `distribute_dataset`). PER_WORKER: `fn` is called once, with
/// `InputContext(num_workers, worker_index, N)`; PER_REPLICA: once per local replica r, with
/// `InputContext(N, worker_index * R + r, N)`.
template <class Fn>
auto distribute_datasets_from_function(Fn& fn, std::vector<Device> devices, int num_workers, int worker_index,
                                       const InputOptions& o, InputAgreement agreement = {}) {
  using DS = std::decay_t<std::invoke_result_t<Fn&, const InputContext&>>;
  static_assert(is_dataset_v<DS>, "distribute_datasets_from_function: the function must return a data::Dataset");
  using E = typename DS::element_type;
  check_input_options(o, true);
  check_workers(num_workers, worker_index, devices.size());
  const int r_count = static_cast<int>(devices.size());
  const int n = num_workers * r_count;
  std::vector<NodePtr<E>> nodes;
  if (o.experimental_replication_mode == InputReplicationMode::PER_WORKER) {
    nodes.push_back(DS(fn(InputContext(num_workers, worker_index, n))).node());
  } else {
    for (int r = 0; r < r_count; ++r) nodes.push_back(DS(fn(InputContext(n, worker_index * r_count + r, n))).node());
  }
  auto state = std::make_shared<DistributedState<E>>();
  state->replica_spec = nodes[0]->spec();
  state->num_local_replicas = devices.size();
  state->buffer_size = o.experimental_per_replica_buffer_size;
  state->num_workers = num_workers;
  state->worker_index = worker_index;
  state->distribution = ::mirrored::detail::str_cat(
      "distribute_datasets_from_function(replication_mode=", static_cast<int>(o.experimental_replication_mode),
      ", fetch_to_device=", o.experimental_fetch_to_device, ")");
  state->pipelines = nodes;
  state->not_resumable_elsewhere =
      "distribute_datasets_from_function: each worker's pipelines are what the function built for its "
      "InputContext, so no position of theirs follows from another placement's (restore the model and "
      "build the function's datasets from the global position instead: docs/fault_tolerance.md)";
  if (num_workers > 1) state->agreement = std::move(agreement);
  state->devices = devices;
  state->fetch_to_device = o.experimental_fetch_to_device;
  state->restore = [nodes, devices, fetch = o.experimental_fetch_to_device](std::stop_token stop, StateReader& r) ->
      typename DistributedState<E>::Source {
        OpenContext pass;
        pass.stop = std::move(stop);
        return FunctionSource<E>::restore(nodes, pass, devices, fetch, r);
      };
  state->open = [nodes, devices = std::move(devices), fetch = o.experimental_fetch_to_device](std::stop_token stop) ->
      typename DistributedState<E>::Source {
        OpenContext pass;
        pass.stop = std::move(stop);
        std::vector<std::unique_ptr<Cursor<E>>> cursors;
        for (const auto& node : nodes) cursors.push_back(node->open(pass));
        return std::make_shared<FunctionSource<E>>(std::move(cursors), devices, fetch);
      };
  return DistributedDataset<E>(std::move(state));
}

}  // namespace data::detail

}  // namespace mirrored
