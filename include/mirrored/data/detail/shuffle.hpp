#pragma once
/// \file
/// Internal: `shuffle(buffer_size, seed)`.
/// Needed by `Dataset<E>::shuffle` (<mirrored/data/dataset.hpp>).

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// SplitMix64: a small, fully specified generator (the same sequence on every platform).
struct SplitMix64 {
  uint64_t state;
  uint64_t operator()() noexcept {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

/// TF's shuffle: a buffer of `buffer_size` elements; each output is a uniformly chosen buffer
/// element, replaced by the next input element. The order depends only on `seed` and on how many
/// iterators the node has opened before (epoch `k` uses the seed mixed with `k`), so a freshly
/// built dataset always yields the same sequence of epochs, and every epoch is ordered differently.
template <class E>
class ShuffleNode final : public Node<E> {
 public:
  ShuffleNode(NodePtr<E> input, int64_t buffer_size, uint64_t seed)
      : Node<E>(input->spec(), input->info()), input_(std::move(input)), buffer_size_(buffer_size), seed_(seed) {
    MIRRORED_ENFORCE(buffer_size >= 1, InvalidArgumentError, "shuffle: buffer_size must be greater than zero (got ",
                     buffer_size, ")");
  }

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    const uint64_t epoch = epochs_.fetch_add(1, std::memory_order_relaxed);
    SplitMix64 mix{seed_};
    const uint64_t epoch_seed = mix() ^ SplitMix64 { epoch * 0xD1B54A32D192ED03ull + 1 }();
    return std::make_unique<ShuffleCursor>(input_->open(ctx), buffer_size_, epoch_seed, ctx.stop);
  }
  /// State: the generator, the buffered elements, and the input's state unless it has ended.
  /// The node's pass counter is part of the graph's counters (`counters`), restored before.
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    const uint64_t rng = r.u64();
    const bool input_done = r.boolean(), filled = r.boolean();
    const uint64_t n = r.count(buffer_size_, 1, "shuffle buffer size");
    std::vector<E> buffer;
    buffer.reserve(static_cast<std::size_t>(n));
    for (uint64_t i = 0; i < n; ++i) buffer.push_back(read_element<E>(r));
    auto c =
        std::make_unique<ShuffleCursor>(input_done ? nullptr : input_->restore(ctx, r), buffer_size_, rng, ctx.stop);
    c->buffer = std::move(buffer);
    c->input_done = input_done;
    c->filled = filled;
    return c;
  }
  std::string describe() const override {
    return ::mirrored::detail::str_cat("shuffle(buffer_size=", buffer_size_, ", seed=", seed_, ")");
  }
  std::vector<const NodeBase*> inputs() const override { return {input_.get()}; }
  /// The number of passes opened so far, which seeds the next one.
  std::vector<uint64_t> counters() const override { return {epochs_.load(std::memory_order_relaxed)}; }
  void set_counters(const std::vector<uint64_t>& v) const override {
    epochs_.store(v.at(0), std::memory_order_relaxed);
  }

 private:
  struct ShuffleCursor final : Cursor<E> {
    std::unique_ptr<Cursor<E>> in;
    std::size_t capacity;
    SplitMix64 rng;
    std::vector<E> buffer;
    bool input_done = false, filled = false;
    std::stop_token stop;
    ShuffleCursor(std::unique_ptr<Cursor<E>> i, int64_t cap, uint64_t seed, std::stop_token s)
        : in(std::move(i)), capacity(static_cast<std::size_t>(cap)), rng{seed}, stop(std::move(s)) {}

    void pull_one() {
      if (input_done) return;
      if (std::optional<E> e = in->next())
        buffer.push_back(std::move(*e));
      else
        input_done = true;
    }
    std::optional<E> next() override {
      if (!filled) {
        filled = true;
        while (!input_done && buffer.size() < capacity) {
          throw_if_cancelled(stop);
          pull_one();
        }
      }
      if (buffer.empty()) return std::nullopt;
      const std::size_t i = static_cast<std::size_t>(rng() % buffer.size());
      std::swap(buffer[i], buffer.back());
      E out = std::move(buffer.back());
      buffer.pop_back();
      pull_one();
      return out;
    }
    void save(StateWriter& w) override {
      w.u64(rng.state);
      w.boolean(input_done);
      w.boolean(filled);
      w.u64(buffer.size());
      for (const E& e : buffer) write_element(w, e);
      if (!input_done) in->save(w);
    }
  };

  NodePtr<E> input_;
  int64_t buffer_size_;
  uint64_t seed_;
  mutable std::atomic<uint64_t> epochs_{0};
};

}  // namespace mirrored::data::detail
