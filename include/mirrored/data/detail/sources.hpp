#pragma once
/// \file
/// Internal: in-memory sources, `range` and `from_tensor_slices`.
/// Needed by `Dataset<E>::range` and `from_tensor_slices` (<mirrored/data/dataset.hpp>).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// `range(start, stop, step)`: int64 scalars, like Python's `range`.
class RangeNode final : public Node<Tensor<int64_t>> {
 public:
  RangeNode(int64_t start, int64_t stop, int64_t step)
      : Node({TensorSpec{{}, DType::int64}}, {}), start_(start), stop_(stop), step_(step) {
    MIRRORED_ENFORCE(step != 0, InvalidArgumentError, "range: step must not be 0");
  }

  std::unique_ptr<Cursor<Tensor<int64_t>>> open(const OpenContext&) const override {
    return std::make_unique<RangeCursor>(start_, stop_, step_);
  }
  /// State: the next value.
  std::unique_ptr<Cursor<Tensor<int64_t>>> restore(const OpenContext&, StateReader& r) const override {
    const int64_t next = r.i64();
    // A value of the sequence (start + k*step), or the first one past its end (unsigned
    // differences: a corrupt value must not overflow).
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    const uint64_t stride = step_ > 0 ? u(step_) : 0 - u(step_);
    const bool on_grid = (step_ > 0 ? u(next) - u(start_) : u(start_) - u(next)) % stride == 0;
    const bool in_range =
        next == start_ || (step_ > 0 ? (next > start_ && (next < stop_ || u(next) - u(stop_) < stride))
                                     : (next < start_ && (next > stop_ || u(stop_) - u(next) < stride)));
    r.check(in_range && on_grid, "a range position outside its range");
    return std::make_unique<RangeCursor>(next, stop_, step_);
  }
  std::string describe() const override {
    return ::mirrored::detail::str_cat("range(", start_, ", ", stop_, ", ", step_, ")");
  }

 private:
  struct RangeCursor final : Cursor<Tensor<int64_t>> {
    int64_t next_value, stop, step;
    RangeCursor(int64_t a, int64_t b, int64_t s) : next_value(a), stop(b), step(s) {}
    std::optional<Tensor<int64_t>> next() override {
      if (step > 0 ? next_value >= stop : next_value <= stop) return std::nullopt;
      const int64_t v = next_value;
      next_value += step;
      return Tensor<int64_t>::scalar(v);
    }
    void save(StateWriter& w) override { w.i64(next_value); }
  };

  int64_t start_, stop_, step_;
};

/// `from_tensor_slices(t...)`: element `i` holds row `i` of every tensor (copied when read, so the
/// data set is never duplicated up front).
template <class E>
class SlicesNode final : public Node<E> {
 public:
  explicit SlicesNode(std::vector<UntypedTensor> tensors)
      : Node<E>(specs_of(tensors), {}), tensors_(std::move(tensors)) {}

  std::unique_ptr<Cursor<E>> open(const OpenContext&) const override {
    return std::make_unique<SlicesCursor>(tensors_);
  }
  /// State: the next row.
  std::unique_ptr<Cursor<E>> restore(const OpenContext&, StateReader& r) const override {
    const int64_t row = r.i64();
    r.check(0 <= row && row <= tensors_[0].shape[0], "a from_tensor_slices row outside the tensors");
    auto c = std::make_unique<SlicesCursor>(tensors_);
    c->row = row;
    return c;
  }
  /// The shapes and dtypes, not the values (equal pipelines are built from equal data).
  std::string describe() const override {
    std::string out = "from_tensor_slices(";
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      out += ::mirrored::detail::str_cat(i ? ", " : "", dtype_name(tensors_[i].dtype),
                                         ::mirrored::detail::format_shape(tensors_[i].shape));
    return out + ")";
  }

 private:
  struct SlicesCursor final : Cursor<E> {
    std::vector<UntypedTensor> tensors;  // shares the node's storage: no copy of the data
    int64_t row = 0;
    explicit SlicesCursor(std::vector<UntypedTensor> t) : tensors(std::move(t)) {}
    std::optional<E> next() override {
      if (row >= tensors[0].shape[0]) return std::nullopt;
      std::vector<UntypedTensor> parts;
      parts.reserve(tensors.size());
      for (const auto& t : tensors) parts.push_back(row_of(t, row));
      ++row;
      return restore_element<E>(parts);
    }
    void save(StateWriter& w) override { w.i64(row); }
  };

 private:
  static std::vector<TensorSpec> specs_of(const std::vector<UntypedTensor>& tensors) {
    std::vector<TensorSpec> specs;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const Shape& s = tensors[i].shape;
      MIRRORED_ENFORCE(!s.empty(), InvalidArgumentError,
                       "from_tensor_slices: Unbatching a tensor is only supported for rank >= 1; component ", i,
                       " has shape ()");
      MIRRORED_ENFORCE(
          s[0] == tensors[0].shape[0], InvalidArgumentError,
          "from_tensor_slices: all tensors must have the same size in the first dimension; component 0 has "
          "shape ",
          ::mirrored::detail::format_shape(tensors[0].shape), " and component ", i, " has shape ",
          ::mirrored::detail::format_shape(s));
      specs.push_back(TensorSpec{Shape(s.begin() + 1, s.end()), tensors[i].dtype});
    }
    return specs;
  }

  std::vector<UntypedTensor> tensors_;
};

}  // namespace mirrored::data::detail
