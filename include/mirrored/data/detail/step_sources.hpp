#pragma once
/// \file
/// Internal: what a distributed iterator runs (on its background thread) to make one step, i.e.
/// one element per local replica: `RebatchSource` for `experimental_distribute_dataset` (cuts
/// global batches into replica slices) and `FunctionSource` for
/// `distribute_datasets_from_function` (deals whole elements to replicas).
/// Needed by `DistributedDataset<E>` (<mirrored/distributed_dataset.hpp>).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/data/detail/rebatch.hpp"
#include "mirrored/device.hpp"

namespace mirrored::data::detail {

/// What a distributed iterator pulls steps from (one element per local replica per step).
template <class E>
class StepSource {
 public:
  virtual ~StepSource() = default;
  /// The next step, or nullopt at the end.
  virtual std::optional<std::vector<E>> next_step() = 0;
  /// Writes the source's position and the rows it holds (see `Cursor::save`).
  virtual void save(StateWriter& w) = 0;
};

/// Writes a step: its element count, then the elements.
template <class E>
void write_step(StateWriter& w, const std::vector<E>& step) {
  w.u64(step.size());
  for (const E& e : step) write_element(w, e);
}
/// Reads a step of `replicas` elements. \throws InvalidArgumentError for another count.
template <class E>
std::vector<E> read_step(StateReader& r, std::size_t replicas) {
  const uint64_t n = r.u64();
  if (n != replicas) r.corrupt(::mirrored::detail::str_cat("a step of ", n, " elements for ", replicas, " replicas"));
  std::vector<E> step;
  step.reserve(replicas);
  for (std::size_t i = 0; i < replicas; ++i) step.push_back(read_element<E>(r));
  return step;
}

/// How a worker turns its dataset's global batches into steps.
struct SplitPlan {
  int num_workers = 1;
  int worker_index = 0;
  std::vector<Device> devices;  // this worker's replicas, in order (R = devices.size())
  bool fetch_to_device = true;  // put slice r on devices[r]
  RebatchPolicy policy = RebatchPolicy::BALANCED;
  bool keep_own_slices = true;  // DATA: of every batch, only this worker's slices; else (FILE,
                                // OFF, HINT) all N slices of the worker's batches, R per step
  bool pass_through = false;    // one replica in sync: elements go through unsplit
};

/// \throws InvalidArgumentError naming the component when a batch cannot be split between
/// `num_slices` replicas (rank 0) or its components' first dimensions differ. Returns the rows.
int64_t check_splittable(const std::vector<UntypedTensor>& batch, int num_slices);
/// Warns (once per source) that a final step with elements for only some replicas was dropped
/// because its elements have rank 0, so no empty batch can stand in for the missing ones.
void warn_dropped_partial_step(std::size_t have, std::size_t replicas);

template <class E>
class RebatchSource final : public StepSource<E> {
 public:
  RebatchSource(std::unique_ptr<Cursor<E>> in, SplitPlan plan, std::stop_token stop = {})
      : in_(std::move(in)), plan_(std::move(plan)), stop_(std::move(stop)) {}

  /// A source positioned by the state `save` wrote (`node` and `ctx` as the saved source's).
  /// `regroup`: the state is another placement's (a DATA-sharded worker's, which holds no slices
  /// between steps); the source goes on with the global batch after the saved position, cut for
  /// `plan`. \throws InvalidArgumentError for corrupt state; what `node.restore` throws.
  static std::shared_ptr<RebatchSource> restore(const Node<E>& node, const OpenContext& ctx, SplitPlan plan,
                                                StateReader& r, bool regroup = false) {
    const bool done = r.boolean();
    int64_t next_group = r.i64(), last_group = r.i64();
    const int64_t saved_workers = regroup ? next_group + 1 : plan.num_workers;  // the groups need not fit `plan`
    r.check(next_group >= 0 && last_group >= -1 && last_group < saved_workers && next_group <= last_group + 1,
            "a slice group outside the workers");
    std::vector<UntypedTensor> batch;
    if (r.boolean()) {
      r.check(!regroup, "slices of a batch held between two steps of a DATA-sharded worker");
      for (DType d : element_dtypes<E>()) batch.push_back(r.tensor(d));
    }
    r.check(next_group > last_group || !batch.empty(), "slices to hand out without a batch");
    if (regroup) next_group = 0, last_group = -1;
    auto source = std::make_shared<RebatchSource>(done ? nullptr : node.restore(ctx, r), std::move(plan), ctx.stop);
    source->done_ = done;
    source->next_group_ = static_cast<int>(next_group);
    source->last_group_ = static_cast<int>(last_group);
    if (!batch.empty()) {
      const int n = source->plan_.num_workers * static_cast<int>(source->plan_.devices.size());
      try {
        source->ranges_ = split_rows(source->plan_.policy, check_splittable(batch, n), n);
      } catch (const InvalidArgumentError& e) {
        r.corrupt(e.what());
      }
      source->batch_ = std::move(batch);
    }
    return source;
  }

  /// State: whether the input has ended, the groups of slices still to hand out of the current
  /// global batch, that batch, then the input's state.
  void save(StateWriter& w) override {
    w.boolean(done_);
    w.i64(next_group_);
    w.i64(last_group_);
    const bool holds = next_group_ <= last_group_;
    w.boolean(holds);
    if (holds && !w.pause_only())
      for (const UntypedTensor& t : batch_) w.tensor(t);
    if (!done_) in_->save(w);
  }

  std::optional<std::vector<E>> next_step() override {
    if (done_) return std::nullopt;
    if (plan_.pass_through) return pass_through();
    const int replicas = static_cast<int>(plan_.devices.size());
    while (next_group_ > last_group_) {
      throw_if_cancelled(stop_);
      std::optional<E> e = in_->next();
      if (!e) {
        done_ = true;
        return std::nullopt;
      }
      batch_ = erase_element(*e);
      const int64_t rows = check_splittable(batch_, plan_.num_workers * replicas);
      ranges_ = split_rows(plan_.policy, rows, plan_.num_workers * replicas);
      next_group_ = plan_.keep_own_slices ? plan_.worker_index : 0;
      last_group_ = plan_.keep_own_slices ? plan_.worker_index : plan_.num_workers - 1;
    }
    return cut(plan_, batch_, ranges_, next_group_++);
  }

  /// The step a DATA-sharded worker of `plan` takes from global batch `batch` (its own slices, or
  /// the batch itself with one replica in sync). \throws InvalidArgumentError as `next_step`.
  static std::vector<E> worker_step(const SplitPlan& plan, const std::vector<UntypedTensor>& batch) {
    if (plan.pass_through) return {placed(plan, batch)};
    const int n = plan.num_workers * static_cast<int>(plan.devices.size());
    return cut(plan, batch, split_rows(plan.policy, check_splittable(batch, n), n), plan.worker_index);
  }

 private:
  // Group `group` of `batch`'s slices (`ranges` in global replica order): one per local replica.
  static std::vector<E> cut(const SplitPlan& plan, const std::vector<UntypedTensor>& batch,
                            const std::vector<RowRange>& ranges, int group) {
    const std::size_t replicas = plan.devices.size();
    std::vector<E> step;
    step.reserve(replicas);
    for (std::size_t r = 0; r < replicas; ++r) {
      const RowRange& range = ranges[static_cast<std::size_t>(group) * replicas + r];
      std::vector<UntypedTensor> parts;
      parts.reserve(batch.size());
      for (const UntypedTensor& t : batch)
        parts.push_back(slice_rows(t, range.first, range.second, plan.fetch_to_device ? plan.devices[r] : t.device()));
      step.push_back(restore_element<E>(parts));
    }
    return step;
  }
  // One replica in sync: the element unsplit, on the replica's device when fetching to devices.
  static E placed(const SplitPlan& plan, std::vector<UntypedTensor> parts) {
    if (plan.fetch_to_device)
      for (auto& p : parts) p = on_device(p, plan.devices[0]);
    return restore_element<E>(parts);
  }
  std::optional<std::vector<E>> pass_through() {
    std::optional<E> e = in_->next();
    if (!e) {
      done_ = true;
      return std::nullopt;
    }
    if (!plan_.fetch_to_device) return std::vector<E>{std::move(*e)};
    return std::vector<E>{placed(plan_, erase_element(*e))};
  }

  std::unique_ptr<Cursor<E>> in_;
  SplitPlan plan_;
  std::vector<UntypedTensor> batch_;      // components of the current global batch
  std::vector<RowRange> ranges_;          // its N slices, global replica order
  int next_group_ = 0, last_group_ = -1;  // groups of R slices still to hand out
  bool done_ = false;
  std::stop_token stop_;
};

/// Deals whole elements to the replicas: one shared cursor (PER_WORKER: replica r of step k gets
/// element k*R + r) or one cursor per replica (PER_REPLICA). When the data runs out in the middle
/// of a step, the replicas left without an element get an empty (0-row) batch shaped like the
/// others'; the iteration ends when no replica gets anything.
template <class E>
class FunctionSource final : public StepSource<E> {
 public:
  FunctionSource(std::vector<std::unique_ptr<Cursor<E>>> cursors, std::vector<Device> devices, bool fetch_to_device)
      : cursors_(std::move(cursors)), devices_(std::move(devices)), fetch_(fetch_to_device) {}

  /// A source positioned by the state `save` wrote (`nodes` and `ctx` as the saved source's).
  /// \throws InvalidArgumentError for corrupt state; what the nodes' `restore` throws.
  static std::shared_ptr<FunctionSource> restore(const std::vector<NodePtr<E>>& nodes, const OpenContext& ctx,
                                                 std::vector<Device> devices, bool fetch_to_device, StateReader& r) {
    const bool done = r.boolean();
    std::vector<std::unique_ptr<Cursor<E>>> cursors;
    for (const auto& node : nodes) cursors.push_back(r.boolean() ? node->restore(ctx, r) : nullptr);
    auto source = std::make_shared<FunctionSource>(std::move(cursors), std::move(devices), fetch_to_device);
    source->done_ = done;
    return source;
  }

  /// State: whether the iteration has ended, then for each cursor whether it is still open and
  /// its state.
  void save(StateWriter& w) override {
    w.boolean(done_);
    for (auto& c : cursors_) {
      w.boolean(c != nullptr);
      if (c) c->save(w);
    }
  }

  std::optional<std::vector<E>> next_step() override {
    if (done_) return std::nullopt;
    const std::size_t replicas = devices_.size();
    std::vector<std::optional<std::vector<UntypedTensor>>> got(replicas);
    std::size_t have = 0, first = replicas;
    for (std::size_t r = 0; r < replicas; ++r) {
      auto& cursor = cursors_.size() == 1 ? cursors_[0] : cursors_[r];
      if (!cursor) continue;
      std::optional<E> e = cursor->next();
      if (!e) {
        cursor.reset();
        continue;
      }
      got[r] = erase_element(*e);
      ++have;
      if (r < first) first = r;
    }
    if (have == 0 || (have < replicas && !paddable(*got[first]))) {
      if (have) warn_dropped_partial_step(have, replicas);
      done_ = true;
      return std::nullopt;
    }
    const std::vector<UntypedTensor> like = *got[first];  // shapes for the empty batches
    std::vector<E> step;
    step.reserve(replicas);
    for (std::size_t r = 0; r < replicas; ++r) {
      std::vector<UntypedTensor> parts = got[r] ? std::move(*got[r]) : like;
      for (auto& p : parts) {
        const Device& dst = fetch_ ? devices_[r] : p.device();
        p = got[r] ? on_device(p, dst) : empty_rows_like(p, dst);
      }
      step.push_back(restore_element<E>(parts));
    }
    return step;
  }

 private:
  static bool paddable(const std::vector<UntypedTensor>& parts) {
    for (const auto& p : parts)
      if (p.shape.empty()) return false;
    return true;
  }

  std::vector<std::unique_ptr<Cursor<E>>> cursors_;
  std::vector<Device> devices_;
  bool fetch_;
  bool done_ = false;
};

}  // namespace mirrored::data::detail
