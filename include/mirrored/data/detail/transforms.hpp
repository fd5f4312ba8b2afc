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
    struct MapCursor final : Cursor<Out> {
      std::unique_ptr<Cursor<In>> in;
      Fn fn;
      MapCursor(std::unique_ptr<Cursor<In>> i, Fn f) : in(std::move(i)), fn(std::move(f)) {}
      std::optional<Out> next() override {
        std::optional<In> e = in->next();
        if (!e) return std::nullopt;
        return Out(invoke_on_element(fn, *e));
      }
    };
    return std::make_unique<MapCursor>(this->input()->open(ctx), fn_);
  }

 private:
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
    };
    return std::make_unique<FilterCursor>(this->input()->open(ctx), pred_, ctx.stop);
  }

 private:
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
    };
    return std::make_unique<TakeSkipCursor>(this->input()->open(ctx), n_, take_, ctx.stop);
  }

 private:
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
    };
    return std::make_unique<RepeatCursor>(this->input(), ctx, count_);
  }

 private:
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
    };
    int64_t n = num_shards_, i = index_;
    if (n == SHARD_HINT) {
      n = ctx.shard_hint ? ctx.num_workers : 1;
      i = ctx.shard_hint ? ctx.worker_index : 0;
    }
    return std::make_unique<ShardCursor>(this->input()->open(ctx), n, i, ctx.stop);
  }

 private:
  int64_t num_shards_, index_;
};

/// `with_options(o)`: the same elements; the graph's options become `o`.
template <class E>
class WithOptionsNode final : public UnaryNode<E, E> {
 public:
  WithOptionsNode(NodePtr<E> input, Options o) : UnaryNode<E, E>(input, input->spec(), with(input->info(), o)) {}
  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override { return this->input()->open(ctx); }

 private:
  static GraphInfo with(GraphInfo info, Options o) {
    info.options = o;
    return info;
  }
};

}  // namespace mirrored::data::detail
