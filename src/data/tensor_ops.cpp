// Row operations of the input pipeline: slicing along axis 0, stacking into batches, empty
// batches, device placement. Host memory only needs memcpy; other devices go through
// copy_between, and copies of slices onto a device through prefetch_between (the input
// pipeline's copy stream).
#include <cstring>

#include "mirrored/data/element.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {
namespace {

namespace core = ::mirrored::detail;

// Elements per row (product of the dimensions after the first), checked like every shape.
int64_t row_elements(const Shape& shape) { return core::shape_numel(Shape(shape.begin() + 1, shape.end())); }

void require_rows(const UntypedTensor& t, const char* op) {
  MIRRORED_ENFORCE(!t.shape.empty(), InvalidArgumentError, op,
                   ": a rank-0 tensor has no rows to slice; its shape is () (batch the dataset first)");
}

}  // namespace

UntypedTensor slice_rows(const UntypedTensor& t, int64_t begin, int64_t end, const Device& dst) {
  require_rows(t, "slice_rows");
  const int64_t rows = t.shape[0];
  MIRRORED_ENFORCE(0 <= begin && begin <= end && end <= rows, InvalidArgumentError, "slice_rows: rows [", begin, ", ",
                   end, ") out of range for a tensor of shape ", core::format_shape(t.shape));
  if (begin == 0 && end == rows && dst == t.device()) return t;
  Shape shape = t.shape;
  shape[0] = end - begin;
  UntypedTensor out = core::make_untyped(t.dtype, shape, dst);
  const std::size_t row_bytes = static_cast<std::size_t>(row_elements(t.shape)) * dtype_size(t.dtype);
  if (out.numel) {
    const auto* src = static_cast<const unsigned char*>(t.data()) + static_cast<std::size_t>(begin) * row_bytes;
    core::prefetch_between(out.data(), dst, src, t.device(), out.bytes());
  }
  return out;
}

UntypedTensor row_of(const UntypedTensor& t, int64_t i) {
  require_rows(t, "row_of");
  MIRRORED_ENFORCE(0 <= i && i < t.shape[0], InvalidArgumentError, "row_of: row ", i,
                   " out of range for a tensor of shape ", core::format_shape(t.shape));
  UntypedTensor out = core::make_untyped(t.dtype, Shape(t.shape.begin() + 1, t.shape.end()), t.device());
  if (out.numel) {
    const auto* src = static_cast<const unsigned char*>(t.data()) + static_cast<std::size_t>(i) * out.bytes();
    core::copy_between(out.data(), t.device(), src, t.device(), out.bytes());
  }
  return out;
}

UntypedTensor stack_rows(const std::vector<UntypedTensor>& items, std::size_t component) {
  MIRRORED_ENFORCE(!items.empty(), InternalError, "stack_rows: nothing to stack");
  const UntypedTensor& first = items[0];
  for (std::size_t i = 1; i < items.size(); ++i) {
    MIRRORED_ENFORCE(items[i].shape == first.shape, InvalidArgumentError,
                     "Cannot batch tensors with different shapes in component ", component,
                     ". First element had shape ", core::format_shape(first.shape), " and element ", i, " had shape ",
                     core::format_shape(items[i].shape), ".");
  }
  Shape shape{static_cast<int64_t>(items.size())};
  shape.insert(shape.end(), first.shape.begin(), first.shape.end());
  UntypedTensor out = core::make_untyped(first.dtype, shape, cpu0);
  const std::size_t row_bytes = first.bytes();
  if (row_bytes) {
    auto* dst = static_cast<unsigned char*>(out.data());
    for (std::size_t i = 0; i < items.size(); ++i)
      core::copy_between(dst + i * row_bytes, cpu0, items[i].data(), items[i].device(), row_bytes);
  }
  return out;
}

UntypedTensor concat_rows(const std::vector<UntypedTensor>& parts, std::size_t component) {
  MIRRORED_ENFORCE(!parts.empty(), InternalError, "concat_rows: nothing to concatenate");
  const UntypedTensor& first = parts[0];
  require_rows(first, "concat_rows");
  const Shape tail(first.shape.begin() + 1, first.shape.end());
  int64_t rows = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    require_rows(parts[i], "concat_rows");
    MIRRORED_ENFORCE(parts[i].dtype == first.dtype && Shape(parts[i].shape.begin() + 1, parts[i].shape.end()) == tail,
                     InvalidArgumentError, "concat_rows: component ", component, " of part ", i, " is ",
                     dtype_name(parts[i].dtype), " of shape ", core::format_shape(parts[i].shape), ", part 0 is ",
                     dtype_name(first.dtype), " of shape ", core::format_shape(first.shape));
    rows += parts[i].shape[0];
  }
  Shape shape = first.shape;
  shape[0] = rows;
  UntypedTensor out = core::make_untyped(first.dtype, shape, cpu0);
  auto* dst = static_cast<unsigned char*>(out.data());
  for (const UntypedTensor& p : parts) {
    const std::size_t n = p.bytes();
    if (n) core::copy_between(dst, cpu0, p.data(), p.device(), n);
    dst += n;
  }
  return out;
}

UntypedTensor empty_rows_like(const UntypedTensor& t, const Device& dst) {
  require_rows(t, "empty_rows_like");
  Shape shape = t.shape;
  shape[0] = 0;
  return core::make_untyped(t.dtype, shape, dst);
}

UntypedTensor on_device(const UntypedTensor& t, const Device& dst) {
  if (t.device() == dst) return t;
  UntypedTensor out = core::make_untyped(t.dtype, t.shape, dst);
  if (out.numel) core::prefetch_between(out.data(), dst, t.data(), t.device(), out.bytes());
  return out;
}

}  // namespace mirrored::data::detail
