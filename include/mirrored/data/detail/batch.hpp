#pragma once
/// \file
/// Internal: `batch(batch_size, drop_remainder)`.
/// Needed by `Dataset<E>::batch` (<mirrored/data/dataset.hpp>).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// Stacks `batch_size` consecutive elements component-wise into one element with a new first
/// dimension (copied into a fresh host tensor). The last batch may be smaller unless
/// `drop_remainder`.
template <class E>
class BatchNode final : public Node<E> {
 public:
  BatchNode(NodePtr<E> input, int64_t batch_size, bool drop_remainder)
      : Node<E>(batched_specs(input->spec(), checked(batch_size), drop_remainder),
                batched_info(input->info(), batch_size, drop_remainder)),
        input_(std::move(input)),
        batch_size_(batch_size),
        drop_remainder_(drop_remainder) {}

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    return std::make_unique<BatchCursor>(input_->open(ctx), batch_size_, drop_remainder_, ctx.stop);
  }
  /// State: whether the input has ended, else the input's (a batch is made within one `next`).
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    const bool done = r.boolean();
    auto c =
        std::make_unique<BatchCursor>(done ? nullptr : input_->restore(ctx, r), batch_size_, drop_remainder_, ctx.stop);
    c->done = done;
    return c;
  }
  std::string describe() const override {
    return ::mirrored::detail::str_cat("batch(", batch_size_, ", drop_remainder=", drop_remainder_ ? "true" : "false",
                                       ")");
  }
  std::vector<const NodeBase*> inputs() const override { return {input_.get()}; }

 private:
  struct BatchCursor final : Cursor<E> {
    std::unique_ptr<Cursor<E>> in;
    int64_t size;
    bool drop, done = false;
    std::stop_token stop;
    BatchCursor(std::unique_ptr<Cursor<E>> i, int64_t b, bool d, std::stop_token s)
        : in(std::move(i)), size(b), drop(d), stop(std::move(s)) {}

    std::optional<E> next() override {
      if (done) return std::nullopt;
      std::vector<std::vector<UntypedTensor>> columns(num_components_v<E>);
      for (auto& c : columns) c.reserve(static_cast<std::size_t>(size < 4096 ? size : 4096));
      int64_t k = 0;
      for (; k < size; ++k) {
        throw_if_cancelled(stop);
        std::optional<E> e = in->next();
        if (!e) {
          done = true;
          break;
        }
        std::vector<UntypedTensor> parts = erase_element(*e);
        for (std::size_t c = 0; c < parts.size(); ++c) columns[c].push_back(std::move(parts[c]));
      }
      if (k == 0 || (k < size && drop)) return std::nullopt;
      std::vector<UntypedTensor> out;
      out.reserve(columns.size());
      for (std::size_t c = 0; c < columns.size(); ++c) out.push_back(stack_rows(columns[c], c));
      return restore_element<E>(out);
    }
    void save(StateWriter& w) override {
      w.boolean(done);
      if (!done) in->save(w);
    }
  };

  static int64_t checked(int64_t batch_size) {
    MIRRORED_ENFORCE(batch_size > 0, InvalidArgumentError, "batch: batch_size must be greater than zero (got ",
                     batch_size, ")");
    return batch_size;
  }
  static std::vector<TensorSpec> batched_specs(std::vector<TensorSpec> specs, int64_t b, bool drop) {
    for (auto& s : specs) {
      if (s.known_rank) s.shape.insert(s.shape.begin(), drop ? b : -1);
    }
    return specs;
  }
  static GraphInfo batched_info(GraphInfo info, int64_t b, bool drop) {
    info.batch_size = b;
    info.drop_remainder = drop;
    return info;
  }

  NodePtr<E> input_;
  int64_t batch_size_;
  bool drop_remainder_;
};

}  // namespace mirrored::data::detail
