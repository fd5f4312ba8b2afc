// Tensor storage and the type-erased tensor helpers.
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/detail/nest.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"
#include "util/log.hpp"

namespace mirrored::detail {

Storage::Storage(const Device& device, std::size_t bytes)
    : device_(device), backend_(&backend_for(device)), bytes_(bytes) {
  ptr_ = backend_->allocate(bytes);
}

Storage::Storage(const Device& device, void* ptr, std::size_t bytes, Release release, void* context)
    : device_(device),
      backend_(&backend_for(device)),
      ptr_(ptr),
      bytes_(bytes),
      foreign_(true),
      release_(release),
      release_context_(context) {}

Storage::~Storage() {
  if (!foreign_) {
    backend_->deallocate(ptr_, bytes_);
    return;
  }
  // The owner may reuse the memory as soon as it is released: kernels this thread queued on it
  // must be done first (a host backend's work is complete already). Keeping flags: a division by
  // zero found meanwhile is the replica's to raise at its next synchronize, not this destructor's
  // to log and drop.
  if (!device_.is_host()) {
    try {
      backend_->wait_keeping_flags(Deadline::after(default_synchronize_timeout_s()));
    } catch (const std::exception& e) {
      MIRRORED_LOG(warn, "releasing foreign memory on ", device_.short_name(),
                   " after a failed synchronize: ", e.what());
    }
  }
  if (release_) release_(release_context_);
}

void check_same_device(const char* op, const Device& a, const Device& b) {
  MIRRORED_ENFORCE(a == b, InvalidArgumentError, op, ": operands are on different devices: ", a.to_string(), " vs ",
                   b.to_string());
}

void throw_incompatible_shapes(const char* op, const Shape& a, const Shape& b) {
  throw InvalidArgumentError(std::string(op) + ": Incompatible shapes: " + format_shape(a) + " vs. " + format_shape(b));
}

UntypedTensor::UntypedTensor() noexcept = default;
UntypedTensor::UntypedTensor(DType dtype, Shape shape, int64_t numel, std::shared_ptr<Storage> storage) noexcept
    : dtype(dtype), shape(std::move(shape)), numel(numel), storage(std::move(storage)) {}
UntypedTensor::UntypedTensor(const UntypedTensor&) = default;
UntypedTensor::UntypedTensor(UntypedTensor&&) noexcept = default;
UntypedTensor& UntypedTensor::operator=(const UntypedTensor&) = default;
UntypedTensor& UntypedTensor::operator=(UntypedTensor&&) noexcept = default;
UntypedTensor::~UntypedTensor() = default;

UntypedTensor make_untyped(DType dtype, const Shape& shape, const Device& device) {
  UntypedTensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.numel = shape_numel(shape, dtype_size(dtype));
  t.storage = std::make_shared<Storage>(device, std::max<std::size_t>(t.bytes(), 1));
  return t;
}

void append_leaf(std::vector<UntypedTensor>& leaves, std::string& structure, UntypedTensor leaf) {
  structure += '.';
  leaves.push_back(std::move(leaf));
}

UntypedTensor cast_untyped(const UntypedTensor& t, DType dtype) {
  if (t.dtype == dtype) return t;
  UntypedTensor out = make_untyped(dtype, t.shape, t.device());
  if (t.numel) backend_for(t.device()).cast(t.dtype, t.data(), dtype, out.data(), t.numel);
  return out;
}

}  // namespace mirrored::detail
