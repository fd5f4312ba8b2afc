#pragma once
/// \file
/// Internal: element-wise transformations (`map`, `filter`) and the ones that select or repeat
/// elements (`take`, `skip`, `repeat`, `shard`, `with_options`).
/// Needed by `Dataset<E>::map`, `filter`, `take`, `skip`, `repeat`, `shard`, `with_options`
/// (<mirrored/data/dataset.hpp>).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// Calls `fn` with the element, or with its components when `fn` takes them one by one (as TF
/// unpacks tuple elements into `map`'s arguments).
template <class Fn, class E>
decltype(auto) invoke_on_element(Fn& fn, const E& e) {
  if constexpr (std::is_invocable_v<Fn&, const E&>) {
    return std::invoke(fn, e);
  } else {
    static_assert(!is_tensor_v<E>, "map/filter: the function cannot be called with the dataset's element type");
    return std::apply(fn, e);
  }
}

/// A predicate's result as a bool: a number, or a one-element tensor (non-zero is true).
template <class R>
bool is_true(const R& r) {
  if constexpr (is_tensor_v<R>)
    return r.item() != 0;
  else
    return static_cast<bool>(r);
}

template <class Fn, class E>
using element_result_t = std::decay_t<decltype(invoke_on_element(std::declval<Fn&>(), std::declval<const E&>()))>;

/// A node with one input whose cursor wraps the input's cursor.
template <class In, class Out>
class UnaryNode : public Node<Out> {
 public:
  UnaryNode(NodePtr<In> input, std::vector<TensorSpec> spec, GraphInfo info)
      : Node<Out>(std::move(spec), std::move(info)), input_(std::move(input)) {}
  const NodePtr<In>& input() const noexcept { return input_; }
  std::vector<const NodeBase*> inputs() const override { return {input_.get()}; }

 private:
  NodePtr<In> input_;
};

/// `map(fn)`: each cursor calls its own copy of `fn` (so a mutable function keeps per-iteration
/// state). Output shapes are unknown until the function runs.
template <class In, class Fn>
class MapNode final : public UnaryNode<In, element_result_t<Fn, In>> {
 public:
  using Out = element_result_t<Fn, In>;
  static_assert(is_element_v<Out>, "map: the function must return a Tensor<T> or a std::tuple<Tensor<Ts>...>");

  MapNode(NodePtr<In> input, Fn fn) : UnaryNode<In, Out>(input, unknown_specs(), input->info()), fn_(std::move(fn)) {}

  std::unique_ptr<Cursor<Out>> open(const OpenContext& ctx) const override {
    return std::make_unique<MapCursor>(this->input()->open(ctx), fn_);
  }
  /// State: the input's (the function is assumed pure: a fresh copy of it is used).
  std::unique_ptr<Cursor<Out>> restore(const OpenContext& ctx, StateReader& r) const override {
    return std::make_unique<MapCursor>(this->input()->restore(ctx, r), fn_);
  }
  std::string describe() const override { return "map()"; }

 private:
  struct MapCursor final : Cursor<Out> {
    std::unique_ptr<Cursor<In>> in;
    Fn fn;
    MapCursor(std::unique_ptr<Cursor<In>> i, Fn f) : in(std::move(i)), fn(std::move(f)) {}
    std::optional<Out> next() override {
      std::optional<In> e = in->next();
      if (!e) return std::nullopt;
      return Out(invoke_on_element(fn, *e));
    }
    void save(StateWriter& w) override { in->save(w); }
  };

  static std::vector<TensorSpec> unknown_specs() {
    std::vector<TensorSpec> specs;
    for (DType d : element_dtypes<Out>()) specs.push_back(TensorSpec::unknown_shape(d));
    return specs;
  }
  Fn fn_;
};

/// `filter(pred)`: keeps elements for which `pred` returns true (a number or a one-element
/// tensor counts as true when non-zero).
template <class E, class Pred>
class FilterNode final : public UnaryNode<E, E> {
 public:
  FilterNode(NodePtr<E> input, Pred pred)
      : UnaryNode<E, E>(input, input->spec(), input->info()), pred_(std::move(pred)) {}

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    return std::make_unique<FilterCursor>(this->input()->open(ctx), pred_, ctx.stop);
  }
  /// State: the input's (the predicate is assumed pure).
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    return std::make_unique<FilterCursor>(this->input()->restore(ctx, r), pred_, ctx.stop);
  }
  std::string describe() const override { return "filter()"; }

 private:
  struct FilterCursor final : Cursor<E> {
    std::unique_ptr<Cursor<E>> in;
    Pred pred;
    std::stop_token stop;
    FilterCursor(std::unique_ptr<Cursor<E>> i, Pred p, std::stop_token s)
        : in(std::move(i)), pred(std::move(p)), stop(std::move(s)) {}
    std::optional<E> next() override {
      while (std::optional<E> e = in->next()) {
        if (is_true(invoke_on_element(pred, *e))) return e;
        throw_if_cancelled(stop);  // it may reject everything, forever
      }
      return std::nullopt;
    }
    void save(StateWriter& w) override { in->save(w); }
  };

  Pred pred_;
};

/// `take(n)` (`n < 0`: everything) and `skip(n)` (`n < 0`: everything is skipped).
template <class E>
class TakeSkipNode final : public UnaryNode<E, E> {
 public:
  TakeSkipNode(NodePtr<E> input, int64_t n, bool take)
      : UnaryNode<E, E>(input, input->spec(), input->info()), n_(n), take_(take) {
    MIRRORED_ENFORCE(n >= -1, InvalidArgumentError, take ? "take" : "skip", ": count must be >= -1 (got ", n, ")");
  }

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    return std::make_unique<TakeSkipCursor>(this->input()->open(ctx), n_, take_, ctx.stop);
  }
  /// State: the count taken or skipped so far, then the input's.
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    const int64_t seen = r.i64();
    r.check(seen >= 0 && (n_ < 0 || seen <= n_), take_ ? "a take count outside [0, n]" : "a skip count outside [0, n]");
    auto c = std::make_unique<TakeSkipCursor>(this->input()->restore(ctx, r), n_, take_, ctx.stop);
    c->seen = seen;
    return c;
  }
  std::string describe() const override { return ::mirrored::detail::str_cat(take_ ? "take(" : "skip(", n_, ")"); }

 private:
  struct TakeSkipCursor final : Cursor<E> {
    std::unique_ptr<Cursor<E>> in;
    int64_t n, seen = 0;
    bool take;
    std::stop_token stop;
    TakeSkipCursor(std::unique_ptr<Cursor<E>> i, int64_t count, bool t, std::stop_token s)
        : in(std::move(i)), n(count), take(t), stop(std::move(s)) {}
    std::optional<E> next() override {
      if (take) {
        if (n >= 0 && seen >= n) return std::nullopt;
        ++seen;
        return in->next();
      }
      for (; n < 0 || seen < n; ++seen) {
        if (!in->next()) return std::nullopt;
        throw_if_cancelled(stop);
      }
      return in->next();
    }
    void save(StateWriter& w) override {
      w.i64(seen);
      in->save(w);
    }
  };

  int64_t n_;
  bool take_;
};

/// `repeat(count)` (`count < 0`: forever). Each repetition opens the input again, so a
/// `shuffle` before `repeat` reshuffles every repetition. An input that yields nothing ends the
/// repetition (instead of looping forever).
template <class E>
class RepeatNode final : public UnaryNode<E, E> {
 public:
  RepeatNode(NodePtr<E> input, int64_t count) : UnaryNode<E, E>(input, input->spec(), input->info()), count_(count) {
    MIRRORED_ENFORCE(count >= -1, InvalidArgumentError, "repeat: count must be >= -1 (got ", count, ")");
  }

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    return std::make_unique<RepeatCursor>(this->input(), ctx, count_);
  }
  /// State: repetitions still to open, whether the current one yielded anything, and the current
  /// repetition's state when one is open (later repetitions are opened anew, as they would be).
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    const int64_t remaining = r.i64();
    r.check(count_ < 0 ? remaining == -1 || remaining == 0 : 0 <= remaining && remaining <= count_,
            "a repeat count outside [0, count]");
    const bool produced = r.boolean();
    auto c = std::make_unique<RepeatCursor>(this->input(), ctx, remaining);
    c->produced = produced;
    if (r.boolean()) c->in = this->input()->restore(ctx, r);
    return c;
  }
  std::string describe() const override { return ::mirrored::detail::str_cat("repeat(", count_, ")"); }

 private:
  struct RepeatCursor final : Cursor<E> {
    NodePtr<E> input;
    OpenContext ctx;
    int64_t remaining;  // repetitions still to open (< 0: unlimited)
    std::unique_ptr<Cursor<E>> in;
    bool produced = false;
    RepeatCursor(NodePtr<E> i, OpenContext c, int64_t count) : input(std::move(i)), ctx(c), remaining(count) {}
    std::optional<E> next() override {
      while (true) {
        throw_if_cancelled(ctx.stop);
        if (!in) {
          if (remaining == 0) return std::nullopt;
          if (remaining > 0) --remaining;
          in = input->open(ctx);
          produced = false;
        }
        if (std::optional<E> e = in->next()) {
          produced = true;
          return e;
        }
        in.reset();
        if (!produced) remaining = 0;  // an empty input would repeat forever
      }
    }
    void save(StateWriter& w) override {
      w.i64(remaining);
      w.boolean(produced);
      w.boolean(in != nullptr);
      if (in) in->save(w);
    }
  };

  int64_t count_;
};

/// `shard(num_shards, index)`: keeps elements `index`, `index + num_shards`, …
/// `shard(SHARD_HINT, SHARD_HINT)` is the input worker's shard under `AutoShardPolicy::HINT`, else
/// everything.
template <class E>
class ShardNode final : public UnaryNode<E, E> {
 public:
  ShardNode(NodePtr<E> input, int64_t num_shards, int64_t index)
      : UnaryNode<E, E>(input, input->spec(), input->info()), num_shards_(num_shards), index_(index) {
    if (num_shards == SHARD_HINT && index == SHARD_HINT) return;
    MIRRORED_ENFORCE(num_shards >= 1, InvalidArgumentError,
                     "shard: Number of shards must be >= 1 (currently num_shards = ", num_shards, ")");
    MIRRORED_ENFORCE(0 <= index && index < num_shards, InvalidArgumentError, "shard: Index must be between 0 and ",
                     num_shards - 1, " (currently index = ", index, ")");
  }

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    const auto [n, i] = resolve(ctx);
    return std::make_unique<ShardCursor>(this->input()->open(ctx), n, i, ctx.stop);
  }
  /// State: how many input elements were read, then the input's.
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    const auto [n, i] = resolve(ctx);
    const int64_t pos = r.i64();
    r.check(pos >= 0, "a negative shard position");
    auto c = std::make_unique<ShardCursor>(this->input()->restore(ctx, r), n, i, ctx.stop);
    c->pos = pos;
    return c;
  }
  std::string describe() const override {
    return ::mirrored::detail::str_cat("shard(", num_shards_, ", ", index_, ")");
  }

 private:
  struct ShardCursor final : Cursor<E> {
    std::unique_ptr<Cursor<E>> in;
    int64_t n, index, pos = 0;
    std::stop_token stop;
    ShardCursor(std::unique_ptr<Cursor<E>> i, int64_t shards, int64_t idx, std::stop_token s)
        : in(std::move(i)), n(shards), index(idx), stop(std::move(s)) {}
    std::optional<E> next() override {
      while (std::optional<E> e = in->next()) {
        if (pos++ % n == index) return e;
        throw_if_cancelled(stop);
      }
      return std::nullopt;
    }
    void save(StateWriter& w) override {
      w.i64(pos);
      in->save(w);
    }
  };
  // The shard count and index this pass uses (SHARD_HINT: the worker's under HINT, else all).
  std::pair<int64_t, int64_t> resolve(const OpenContext& ctx) const {
    if (num_shards_ != SHARD_HINT) return {num_shards_, index_};
    return ctx.shard_hint ? std::pair<int64_t, int64_t>{ctx.num_workers, ctx.worker_index}
                          : std::pair<int64_t, int64_t>{1, 0};
  }

  int64_t num_shards_, index_;
};

/// `with_options(o)`: the same elements; the graph's options become `o`.
template <class E>
class WithOptionsNode final : public UnaryNode<E, E> {
 public:
  WithOptionsNode(NodePtr<E> input, Options o) : UnaryNode<E, E>(input, input->spec(), with(input->info(), o)) {}
  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override { return this->input()->open(ctx); }
  /// State: the input's (this node has no cursor of its own).
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    return this->input()->restore(ctx, r);
  }
  std::string describe() const override {
    return ::mirrored::detail::str_cat("with_options(auto_shard_policy=",
                                       static_cast<int>(this->info().options.experimental_distribute.auto_shard_policy),
                                       ")");
  }

 private:
  static GraphInfo with(GraphInfo info, Options o) {
    info.options = o;
    return info;
  }
};

}  // namespace mirrored::data::detail
