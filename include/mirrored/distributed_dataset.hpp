#pragma once
/// \file
/// Distributed input: `DistributedDataset<E>` and `DistributedIterator<E>` (what
/// `Strategy::experimental_distribute_dataset` and `Strategy::distribute_datasets_from_function`
/// return), and the definitions of those two `Strategy` methods.

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
#include "mirrored/data/detail/distribute.hpp"
#include "mirrored/data/detail/prefetch.hpp"
#include "mirrored/data/detail/step_sources.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/input_options.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored {

/// An iterator over a distributed dataset (TF's `tf.distribute.DistributedIterator`): each step
/// is a `PerReplica<E>` with one element per replica, on that replica's device. Unless the
/// per-replica buffer size is 0, a background thread prepares the next steps (reads, slices and
/// copies them) while the caller runs the current one; it is stopped and joined when the
/// iterator is destroyed, also when the pipeline is in the middle of a long pull (a `filter` that
/// rejects everything of an endless `repeat`: the pipeline's loops observe the cancellation; only
/// a map function that itself never returns can delay it). Errors of the pipeline (a map
/// function's exception, a missing file) are rethrown, with their type, by the call that would
/// have returned the failed step; the pass is over after that. Move-only; use from one thread.
///
/// Checkpointing (what `checkpoint::CheckpointManager` tracks): `save_state` returns this
/// worker's position as opaque bytes; `restore_state` on an iterator of an equal distributed
/// dataset (same pipeline, same strategy shape, e.g. in a restarted process) makes it yield
/// exactly the steps the saved iterator would have yielded next, bitwise, and later passes as
/// they would have been. The steps prepared by the background thread and not yet taken are part
/// of the state (nothing prepared is lost or repeated); see `Dataset::Iterator` for what the
/// pipeline's state holds. A state records the number of input workers, this worker's index,
/// the local replicas and the replicas in sync, the pipeline and the steps taken in the pass;
/// `restore_state(state)` refuses it anywhere else, and `restore_state(states)`, given every saved
/// worker's state, resumes a DATA-sharded pass on another placement (other worker or replica
/// counts) at the same global position.
///
/// Several input workers (`MultiWorkerMirroredStrategy`): the workers end together, by TF's rule
/// for uneven input. Each step (each call that takes one: `get_next`, `get_next_as_optional`,
/// `*it`, `it == end`) the workers agree, in one cross-worker exchange on the caller's thread,
/// whether any of them has another step; a worker whose input has ended gets a step of empty
/// batches (0 rows, the other dimensions and dtypes of the per-replica element spec) until every
/// worker's has, so every worker runs the same number of steps and the loop ends on all of them
/// at once. Hence every worker takes its steps at the same points of its sequence of collectives
/// (as a training loop does), and never from inside `run`. Where the elements have rank 0 (no
/// empty batch can stand in), the iteration ends on every worker when the first worker's input
/// ends, and the others' remaining steps are dropped with a warning. A saved state records
/// whether the workers had agreed on the end.
template <class E>
class DistributedIterator {
 public:
  using value_type = PerReplica<E>;
  using difference_type = std::ptrdiff_t;
  using iterator_concept = std::input_iterator_tag;

  /// An iterator at the end.
  DistributedIterator() = default;
  DistributedIterator(DistributedIterator&&) noexcept = default;
  DistributedIterator& operator=(DistributedIterator&&) noexcept = default;

  /// The next step, or nullopt at the end. \throws what the input pipeline threw.
  std::optional<PerReplica<E>> get_next_as_optional() {
    std::optional<PerReplica<E>> step;
    if (fetched_) {
      fetched_ = false;
      step = std::exchange(current_, std::nullopt);
    } else {
      step = pull();
    }
    if (step) ++taken_;
    return step;
  }
  /// The next step. \throws OutOfRangeError ("End of sequence") at the end; what the input
  /// pipeline threw.
  PerReplica<E> get_next() {
    std::optional<PerReplica<E>> step = get_next_as_optional();
    MIRRORED_ENFORCE(step.has_value(), OutOfRangeError, "End of sequence");
    return std::move(*step);
  }
  /// Per-replica element specs (as `DistributedDataset::element_spec`).
  PerReplica<data::ElementSpec<E>> element_spec() const {
    MIRRORED_ENFORCE(state_ != nullptr, FailedPreconditionError, "DistributedIterator: default-constructed");
    return PerReplica<data::ElementSpec<E>>(std::vector<data::ElementSpec<E>>(
        state_->num_local_replicas, data::detail::make_element_spec<E>(state_->replica_spec)));
  }

  /// The current step. \throws OutOfRangeError at the end.
  const PerReplica<E>& operator*() const {
    fetch();
    MIRRORED_ENFORCE(current_.has_value(), OutOfRangeError, "End of sequence");
    return *current_;
  }
  /// Moves past the current step (waiting for it first if nobody looked at it).
  /// \throws what the input pipeline threw.
  DistributedIterator& operator++() {
    fetch();
    if (current_) ++taken_;
    fetched_ = false;
    current_.reset();
    return *this;
  }
  /// As prefix `++`.
  void operator++(int) { ++*this; }
  /// True at the end (waits for the next step to find out). \throws what the input pipeline threw.
  friend bool operator==(const DistributedIterator& it, std::default_sentinel_t) {
    it.fetch();
    return !it.current_.has_value();
  }

  /// This worker's position (see the class comment) as opaque bytes for `restore_state`. The
  /// background thread is paused (between two steps) while the state is taken and goes on after.
  /// \throws FailedPreconditionError for a default-constructed iterator, or when the background
  /// thread has failed ahead of the steps taken (take them: the error is reported);
  /// UnimplementedError naming a custom dataset node or cursor that cannot save its state.
  std::string save_state() {
    MIRRORED_ENFORCE(state_ != nullptr, FailedPreconditionError,
                     "DistributedIterator save_state: default-constructed iterator");
    const std::string pipeline = describe();
    data::detail::StateWriter pass;  // keeps the threads paused until the state is complete
    std::vector<std::shared_ptr<const std::vector<E>>> queued;
    if (prefetcher_) {
      queued = prefetcher_->pause();
      Steps* p = prefetcher_.get();
      pass.hold([p] { p->resume(); });
    }
    // The steps not yet taken, oldest first: one looked at (`*it`), restored ones, prepared ones.
    const bool looked = fetched_ && current_.has_value();
    pass.u64((looked ? 1 : 0) + ready_.size() + queued.size());
    if (looked) data::detail::write_step(pass, current_->values());
    for (const auto& step : ready_) data::detail::write_step(pass, step);
    for (const auto& step : queued) data::detail::write_step(pass, *step);
    pass.boolean(ended_);
    pass.boolean(source_ != nullptr);
    if (source_) source_->save(pass);

    data::detail::StateWriter w;
    data::detail::write_state_header(w, data::detail::StateKind::distributed);
    data::detail::write_placement(w, placement());
    w.str(pipeline);
    const std::vector<uint64_t> counters = all_counters();
    w.u64(counters.size());
    for (uint64_t c : counters) w.u64(c);
    w.u64(taken_);
    w.str(pass.take());
    return w.take();
  }

  /// The steps taken in this pass so far (restored with the position): with
  /// `experimental_distribute_dataset` under DATA sharding, the global batches consumed, the
  /// same on every worker.
  uint64_t steps_taken() const noexcept { return taken_; }

  /// Replaces this iterator's pass by the one `state` (from `save_state`) describes, and sets the
  /// pipelines' shuffle pass counters as they were (so restore into a freshly built dataset). A
  /// failure changes nothing.
  /// \throws FailedPreconditionError for a default-constructed iterator; InvalidArgumentError
  /// when the state was saved with another number of input workers, worker index, local
  /// replicas or replicas in sync, or from another pipeline (naming both sides), or when the bytes
  /// are no such state, truncated or corrupt; for a file source, what opening the file at the
  /// saved position throws.
  void restore_state(const std::string& state) {
    MIRRORED_ENFORCE(state_ != nullptr, FailedPreconditionError,
                     "DistributedIterator restore_state: default-constructed iterator");
    data::detail::StateReader r(state, "DistributedIterator restore_state");
    const uint64_t version = data::detail::read_state_header(r, data::detail::StateKind::distributed);
    data::detail::check_placement(r, placement());
    const std::string saved = r.str();
    data::detail::check_same_pipeline(r, saved, describe());
    std::vector<uint64_t> counters(static_cast<std::size_t>(r.count(-1, 8, "pass counters")));
    for (uint64_t& c : counters) c = r.u64();
    const uint64_t taken = version >= data::detail::kStateVersionWithSteps ? r.u64() : 0;
    const std::string pass = r.str();
    r.expect_end();
    data::detail::StateReader pr(pass, r.op());
    const uint64_t n = pr.count(-1, 8, "steps not yet taken");
    std::vector<std::vector<E>> ready;
    for (uint64_t i = 0; i < n; ++i) ready.push_back(data::detail::read_step<E>(pr, state_->num_local_replicas));
    const bool ended = pr.boolean();
    pr.check(!ended || n == 0, "steps to take after the workers agreed on the end");
    const bool active = pr.boolean();
    pr.check(!ended || !active, "an open pass after the workers agreed on the end");
    if (!active) pr.expect_end();
    install(counters, r, std::move(ready), ended, active ? &pr : nullptr, taken, state_->restore);
  }

  /// Resumes the pass that every worker of a saved job was in (`states[k]`: worker k's
  /// `save_state`, as `CheckpointManager` keeps them) -- also on another placement: another
  /// number of input workers or replicas per worker. On the placement of the save this is
  /// `restore_state(states[worker_index])`, bitwise. Elsewhere the saved global position
  /// (the global batches consumed, the same on every saved worker) carries over: the global
  /// batches some saved worker had prepared but not every worker had taken are put together from
  /// their slices and cut by this placement's split rule, the pipeline goes on from the
  /// position of the saved worker that had read least far ahead, and so every element of the
  /// pass is taken exactly once over the restart, in the global batches of the uninterrupted pass.
  /// Only a dataset of `experimental_distribute_dataset` under DATA sharding (or with one worker on
  /// both sides) resumes elsewhere: FILE, HINT and OFF sharding and
  /// `distribute_datasets_from_function` keep a position per worker that no other placement's
  /// follows from. A failure changes nothing.
  /// \throws FailedPreconditionError for a default-constructed iterator; InvalidArgumentError
  /// when the states are not every worker's of one pass at one step, when the placement differs
  /// and the dataset is not resumable elsewhere (naming both placements and why), when the
  /// pipelines differ, and as `restore_state(state)`.
  void restore_state(const std::vector<std::string>& states) {
    MIRRORED_ENFORCE(state_ != nullptr, FailedPreconditionError,
                     "DistributedIterator restore_state: default-constructed iterator");
    const std::string op = "DistributedIterator restore_state";
    std::vector<data::detail::SavedIteratorState> saved;
    for (const std::string& s : states) saved.push_back(data::detail::read_saved_state(s, op));
    data::detail::check_saved_workers(saved, op);
    const data::detail::IteratorPlacement here = placement(), there = saved[0].placement;
    if (there.num_workers == here.num_workers && there.local_replicas == here.local_replicas) {
      restore_state(states[static_cast<std::size_t>(here.worker_index)]);
      return;
    }
    const std::string moving =
        ::mirrored::detail::str_cat(op, ": saved on ", data::detail::describe_placement(there), ", restoring on ",
                                    data::detail::describe_placement(here), ": ");
    MIRRORED_ENFORCE(state_->not_resumable_elsewhere.empty(), InvalidArgumentError, moving,
                     "the pass cannot resume on another placement: ", state_->not_resumable_elsewhere);
    for (const data::detail::SavedIteratorState& one : saved)
      MIRRORED_ENFORCE(one.pipeline == describe(), InvalidArgumentError, moving,
                       "another placement resumes only the same pipeline, DATA-sharded on both sides; worker ",
                       one.placement.worker_index, "'s state was saved from the pipeline ", one.pipeline,
                       ", restoring into ", describe());
    // Each saved worker's steps not yet taken (its slices of the next global batches), read onto
    // the host: they come from other processes' devices.
    const auto saved_replicas = static_cast<std::size_t>(there.local_replicas);
    std::vector<data::detail::StateReader> passes;
    passes.reserve(saved.size());
    std::vector<std::vector<std::vector<E>>> queued(saved.size());
    std::vector<bool> ended(saved.size()), active(saved.size());
    std::size_t least = 0;  // the worker that had read least far ahead
    for (std::size_t k = 0; k < saved.size(); ++k) {
      data::detail::StateReader& pr = passes.emplace_back(saved[k].pass, op);
      pr.read_to_host(true);
      const uint64_t n = pr.count(-1, 8, "steps not yet taken");
      for (uint64_t i = 0; i < n; ++i) queued[k].push_back(data::detail::read_step<E>(pr, saved_replicas));
      pr.read_to_host(false);
      ended[k] = pr.boolean();
      active[k] = pr.boolean();
      pr.check(!ended[k] || (n == 0 && !active[k]), "steps to take after the workers agreed on the end");
      pr.check(ended[k] == ended[0], "workers that disagree on whether the pass has ended");
      if (queued[k].size() < queued[least].size()) least = k;
    }
    // The global batches every saved worker had prepared its slices of, whole again, as this
    // worker's steps.
    std::vector<std::vector<E>> ready;
    for (std::size_t j = 0; j < queued[least].size(); ++j) {
      std::vector<data::detail::UntypedTensor> batch;
      if (there.replicas_in_sync == 1) {
        batch = data::detail::erase_element(queued[0][j][0]);
      } else {
        const std::size_t components = data::detail::element_dtypes<E>().size();
        std::vector<std::vector<data::detail::UntypedTensor>> parts(components);
        for (const auto& worker : queued)
          for (const E& slice : worker[j]) {
            std::vector<data::detail::UntypedTensor> c = data::detail::erase_element(slice);
            for (std::size_t i = 0; i < components; ++i) parts[i].push_back(std::move(c[i]));
          }
        for (std::size_t i = 0; i < components; ++i) batch.push_back(data::detail::concat_rows(parts[i], i));
      }
      ready.push_back(state_->worker_step(batch));
    }
    data::detail::StateReader& from = passes[least];
    if (!active[least]) from.expect_end();
    install(saved[least].counters, from, std::move(ready), ended[least], active[least] ? &from : nullptr,
            saved[least].steps_taken.value_or(0), state_->restore_regrouped);
  }

 private:
  friend class DistributedDataset<E>;
  using Steps = data::detail::Prefetcher<std::vector<E>>;
  using Source = typename data::detail::DistributedState<E>::Source;
  using Restore = std::function<Source(std::stop_token, data::detail::StateReader&)>;

  // Replaces this pass by a restored one: the pipelines' pass counters `counters` (`r` names the
  // operation in errors), the steps `ready` first, then, unless `pr` is null (the pass had
  // ended), a source that `restore` reads from `pr`; `taken` steps taken so far.
  void install(const std::vector<uint64_t>& counters, const data::detail::StateReader& r,
               std::vector<std::vector<E>> ready, bool ended, data::detail::StateReader* pr, uint64_t taken,
               const Restore& restore) {
    // The pass being replaced is paused until it is gone (its threads could open passes of a
    // shuffle, counting them, while the counters are set); one that has failed is simply gone.
    data::detail::StateWriter paused(true);
    try {
      pause_into(paused);
    } catch (const Error&) {
      finish();
      paused.forget();
    }
    const std::vector<uint64_t> before = all_counters();
    set_all_counters(counters, r);
    DistributedIterator fresh;
    try {
      if (pr) {
        std::stop_source stop;  // the fresh pass's, when it gets a thread
        Source source = restore(state_->buffer_size > 0 ? stop.get_token() : std::stop_token{}, *pr);
        pr->expect_end();
        fresh = DistributedIterator(state_, std::move(source), std::move(ready), std::move(stop));
      } else {
        fresh = DistributedIterator(state_, nullptr, std::move(ready), {});
        fresh.ended_ = ended;
      }
    } catch (...) {
      set_all_counters(before, r);
      throw;
    }
    fresh.taken_ = taken;
    *this = std::move(fresh);  // stops the old (paused) thread
    paused.forget();
  }

  explicit DistributedIterator(std::shared_ptr<const data::detail::DistributedState<E>> state)
      : state_(std::move(state)) {
    if (state_->buffer_size > 0) {
      std::stop_source pass;  // requested when the background thread is stopped
      Source source = state_->open(pass.get_token());
      start(std::move(source), {}, std::move(pass));
    } else {
      source_ = state_->open(std::stop_token{});  // pulled on the caller's thread: nothing to cancel
    }
  }
  // A restored pass: `ready` steps first, then `source`'s (null: none, the pass had ended).
  DistributedIterator(std::shared_ptr<const data::detail::DistributedState<E>> state, Source source,
                      std::vector<std::vector<E>> ready, std::stop_source pass)
      : state_(std::move(state)) {
    if (source && state_->buffer_size > 0) {
      start(std::move(source), std::move(ready), std::move(pass));
    } else {
      source_ = std::move(source);
      for (auto& step : ready) ready_.push_back(std::move(step));
    }
  }
  void start(Source source, std::vector<std::vector<E>> ready, std::stop_source pass) {
    source_ = source;
    prefetcher_ = std::make_unique<Steps>([source] { return source->next_step(); }, state_->buffer_size,
                                          std::move(pass), std::stop_token{}, std::move(ready));
  }

  data::detail::IteratorPlacement placement() const {
    const auto local = static_cast<int64_t>(state_->num_local_replicas);
    return {state_->num_workers, state_->worker_index, local, state_->num_workers * local};
  }
  std::string describe() const {
    std::string out = state_->distribution;
    for (const auto& node : state_->pipelines) out += " " + data::detail::describe_graph(*node);
    return out;
  }
  std::vector<uint64_t> all_counters() const {
    std::vector<uint64_t> out;
    for (const auto& node : state_->pipelines) {
      const std::vector<uint64_t> c = data::detail::graph_counters(*node);
      out.insert(out.end(), c.begin(), c.end());
    }
    return out;
  }
  // Validates the count first, then sets each pipeline's share.
  void set_all_counters(const std::vector<uint64_t>& values, const data::detail::StateReader& r) const {
    const std::size_t expected = all_counters().size();
    if (values.size() != expected)
      r.corrupt(::mirrored::detail::str_cat(values.size(), " pass counters where the pipelines have ", expected));
    std::size_t at = 0;
    for (const auto& node : state_->pipelines) {
      const std::size_t k = data::detail::graph_counters(*node).size();
      data::detail::set_graph_counters(*node,
                                       std::vector<uint64_t>(values.begin() + static_cast<std::ptrdiff_t>(at),
                                                             values.begin() + static_cast<std::ptrdiff_t>(at + k)),
                                       r);
      at += k;
    }
  }
  // Pauses this pass's threads until `w` is destroyed.
  void pause_into(data::detail::StateWriter& w) {
    if (prefetcher_) {
      prefetcher_->pause();
      Steps* p = prefetcher_.get();
      w.hold([p] { p->resume(); });
    }
    if (source_) source_->save(w);
  }

  std::optional<PerReplica<E>> pull() const {
    if (ended_) return std::nullopt;  // every worker's input has ended: nothing more to agree on
    std::optional<std::vector<E>> step;
    try {
      if (prefetcher_) {
        step = prefetcher_->next();
      } else if (!ready_.empty()) {
        step = std::move(ready_.front());
        ready_.pop_front();
      } else if (source_) {
        step = source_->next_step();
      }
    } catch (...) {
      finish();
      if (state_->agreement) state_->agreement.input_failed(std::current_exception());
      throw;
    }
    if (!step) finish();
    if (state_->agreement) return agree(std::move(step));
    if (!step) return std::nullopt;
    return PerReplica<E>(std::move(*step));
  }
  // Several workers: this worker's next step (nullopt: its input has ended) becomes the step of
  // TF's rule, after the workers' exchange (one per step, on the caller's thread, so that it
  // falls at the same point of every worker's sequence of collectives; the background thread
  // only reads ahead locally).
  std::optional<PerReplica<E>> agree(std::optional<std::vector<E>> step) const {
    const int with_input = state_->agreement.count_with_input(step.has_value());
    // Decided from what every worker knows alike (the count and the spec).
    if (with_input == 0 || (with_input < state_->num_workers && !data::detail::paddable(state_->replica_spec))) {
      if (step) {
        data::detail::warn_dropped_worker_step(state_->worker_index);
        finish();
      }
      ended_ = true;
      return std::nullopt;
    }
    if (step) {
      seen_.clear();
      for (const data::detail::UntypedTensor& t : data::detail::erase_element((*step)[0])) seen_.push_back(t.shape);
      return PerReplica<E>(std::move(*step));
    }
    std::vector<E> empty;
    empty.reserve(state_->num_local_replicas);
    for (std::size_t r = 0; r < state_->num_local_replicas; ++r) {
      const Device dst = state_->fetch_to_device ? state_->devices.at(r) : cpu0;
      empty.push_back(data::detail::restore_element<E>(data::detail::empty_batch(state_->replica_spec, seen_, dst)));
    }
    return PerReplica<E>(std::move(empty));
  }
  void finish() const {
    prefetcher_.reset();  // stops and joins the background thread
    source_ = nullptr;
    ready_.clear();
  }
  void fetch() const {
    if (!fetched_) {
      current_ = pull();
      fetched_ = true;
    }
  }

  std::shared_ptr<const data::detail::DistributedState<E>> state_;
  mutable Source source_;  // read by the thread when there is one; saved while it is paused
  mutable std::unique_ptr<Steps> prefetcher_;
  mutable std::deque<std::vector<E>> ready_;  // restored steps, when no thread hands them out
  mutable std::optional<PerReplica<E>> current_;
  mutable bool fetched_ = false;
  // Several workers: every worker's input has ended (agreed), and the shapes of this worker's
  // last element, which its empty batches follow where the spec leaves dimensions unknown.
  mutable bool ended_ = false;
  mutable std::vector<Shape> seen_;
  uint64_t taken_ = 0;  // steps taken in this pass
};

/// A dataset distributed over a strategy's replicas (TF's `tf.distribute.DistributedDataset`).
/// Iterating it (range-for, or `begin()` and `get_next()`) yields one `PerReplica<E>` per step;
/// each `begin()` starts a new pass (epoch). No further transformations can be applied. Cheap to
/// copy (copies share the description).
template <class E>
class DistributedDataset {
 public:
  /// Wraps a state built by `data::detail::distribute_dataset` and friends.
  explicit DistributedDataset(std::shared_ptr<const data::detail::DistributedState<E>> state)
      : state_(std::move(state)) {}

  /// A new pass, with its background thread started (it prepares the first steps right away).
  DistributedIterator<E> begin() const { return DistributedIterator<E>(state_); }
  /// The end sentinel of every pass.
  std::default_sentinel_t end() const noexcept { return {}; }

  /// What each replica receives per step (TF's `PerReplicaSpec`): one spec per local replica. The
  /// first dimension is the per-replica batch size when it is the same in every step, else -1.
  PerReplica<data::ElementSpec<E>> element_spec() const {
    return PerReplica<data::ElementSpec<E>>(std::vector<data::ElementSpec<E>>(
        state_->num_local_replicas, data::detail::make_element_spec<E>(state_->replica_spec)));
  }

 private:
  std::shared_ptr<const data::detail::DistributedState<E>> state_;
};

// ---------------------------------------------------------------------------------------------
// Strategy methods (declared in strategy.hpp).

namespace detail {
/// The end-of-input agreement of `strategy`'s workers (empty with one worker).
inline data::detail::InputAgreement input_agreement(Strategy& strategy) {
  if (strategy.extended().num_workers() == 1) return {};
  Strategy* s = &strategy;
  return {[s, alive = strategy.weak_id()](bool mine) {
            MIRRORED_ENFORCE(!alive.expired(), FailedPreconditionError,
                             "DistributedIterator: the strategy of this distributed dataset was destroyed");
            return count_workers_with_input(*s, mine);
          },
          [s, alive = strategy.weak_id()](const std::exception_ptr& error) {
            if (!alive.expired()) input_failed(*s, error);
          }};
}

template <class E>
DistributedDataset<E> distribute_dataset_of(Strategy& strategy, data::Dataset<E> ds, InputOptions o) {
  StrategyExtended& x = strategy.extended();
  return data::detail::distribute_dataset(ds, x.worker_devices(), x.num_workers(), x.worker_index(), o,
                                          input_agreement(strategy));
}

template <class Fn>
auto datasets_from_function_of(Strategy& strategy, Fn& dataset_fn, InputOptions o) {
  StrategyExtended& x = strategy.extended();
  return data::detail::distribute_datasets_from_function(dataset_fn, x.worker_devices(), x.num_workers(),
                                                         x.worker_index(), o, input_agreement(strategy));
}
}  // namespace detail

}  // namespace mirrored
