// Tensor<T>'s members, compiled once for every element type (include/mirrored/tensor.hpp declares
// them): a user's translation unit calls them instead of compiling them.
#include "mirrored/tensor.hpp"

#include <algorithm>
#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/format.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

template <class T>
Tensor<T>::Tensor() : shape_{0} {}
template <class T>
Tensor<T>::Tensor(const Tensor&) = default;
template <class T>
Tensor<T>::Tensor(Tensor&&) noexcept = default;
template <class T>
Tensor<T>& Tensor<T>::operator=(const Tensor&) = default;
template <class T>
Tensor<T>& Tensor<T>::operator=(Tensor&&) noexcept = default;
template <class T>
Tensor<T>::~Tensor() = default;

template <class T>
Tensor<T>::Tensor(const detail::UntypedTensor& u) : shape_(u.shape), numel_(u.numel), storage_(u.storage) {}

template <class T>
detail::UntypedTensor Tensor<T>::erased() const {
  return detail::UntypedTensor(dtype_of<T>(), shape_, numel_, storage_);
}

template <class T>
Tensor<T>::Tensor(Shape shape, const Device& d)
    : shape_(std::move(shape)), numel_(detail::shape_numel(shape_, sizeof(T))) {
  storage_ = std::make_shared<detail::Storage>(d, std::max<std::size_t>(bytes(), 1));
}

template <class T>
Tensor<T> Tensor<T>::from_vector(std::vector<T> values, Shape shape, const Device& d) {
  const int64_t n = detail::shape_numel(shape, sizeof(T));
  MIRRORED_ENFORCE(static_cast<int64_t>(values.size()) == n, InvalidArgumentError,
                   "Tensor::from_vector: ", values.size(), " values cannot fill shape ", detail::format_shape(shape),
                   " (", n, " elements)");
  Tensor t(std::move(shape), d);
  if (n) t.storage_->backend().copy_from_host(t.data(), values.data(), n * sizeof(T));
  return t;
}

template <class T>
Tensor<T> Tensor<T>::full(Shape shape, T value, const Device& d) {
  Tensor t(std::move(shape), d);
  if (t.numel_) t.storage_->backend().fill(dtype_of<T>(), t.data(), t.numel_, &value);
  return t;
}

template <class T>
std::vector<T> Tensor<T>::to_vector() const {
  std::vector<T> out(numel_);
  if (numel_) {
    auto& be = storage_->backend();
    be.synchronize();
    be.copy_to_host(out.data(), data(), numel_ * sizeof(T));
  }
  return out;
}

template <class T>
T Tensor<T>::item() const {
  MIRRORED_ENFORCE(numel_ == 1, InvalidArgumentError, "Tensor::item: tensor of shape ", detail::format_shape(shape_),
                   " has ", numel_, " elements, expected exactly 1");
  return to_vector()[0];
}

template <class T>
Tensor<T> Tensor<T>::to(const Device& d) const {
  Tensor t(shape_, d);
  if (numel_) detail::copy_between(t.data(), d, data(), device(), bytes());
  return t;
}

template <class T>
Tensor<T> Tensor<T>::reshape(Shape shape) const {
  const int64_t n = detail::shape_numel(shape, sizeof(T));
  MIRRORED_ENFORCE(n == numel_, InvalidArgumentError, "Tensor::reshape: cannot reshape a tensor of shape ",
                   detail::format_shape(shape_), " (", numel_, " elements) to shape ", detail::format_shape(shape),
                   " (", n, " elements)");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

template <class T>
Tensor<T> Tensor<T>::binary(detail::BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  detail::check_same_device(name, a.device(), b.device());
  const bool a_scalar = a.rank() == 0 && b.rank() != 0;
  const bool b_scalar = b.rank() == 0 && a.rank() != 0;
  if (!a_scalar && !b_scalar && a.shape_ != b.shape_) detail::throw_incompatible_shapes(name, a.shape_, b.shape_);
  Tensor out(a_scalar ? b.shape_ : a.shape_, a.device());
  if (out.numel_)
    out.storage_->backend().binary(op, dtype(), a.data(), a_scalar, b.data(), b_scalar, out.data(), out.numel_);
  return out;
}

template <class T>
std::ostream& Tensor<T>::print(std::ostream& os) const {
  const std::vector<T> host = to_vector();
  return os << "<Tensor: shape=" << detail::format_shape(shape_) << ", dtype=" << dtype_name(dtype())
            << ", value=" << detail::format_values(host.data(), shape_) << ">";
}

template <class To, class From>
Tensor<To> cast(const Tensor<From>& t) {
  if constexpr (std::is_same_v<To, From>) {
    return t;
  } else {
    using detail::TensorAccess;
    return TensorAccess::restore<To>(detail::cast_untyped(TensorAccess::erase(t), dtype_of<To>()));
  }
}

// Every element type Tensor<T> supports (is_tensor_element_v), and cast between any two of them.
#define MIRRORED_TENSOR_CASTS(From)                                  \
  template Tensor<float> cast<float, From>(const Tensor<From>&);     \
  template Tensor<double> cast<double, From>(const Tensor<From>&);   \
  template Tensor<int32_t> cast<int32_t, From>(const Tensor<From>&); \
  template Tensor<int64_t> cast<int64_t, From>(const Tensor<From>&); \
  template Tensor<uint8_t> cast<uint8_t, From>(const Tensor<From>&); \
  template Tensor<float16> cast<float16, From>(const Tensor<From>&); \
  template Tensor<bfloat16> cast<bfloat16, From>(const Tensor<From>&);
#define MIRRORED_TENSOR(T)  \
  template class Tensor<T>; \
  MIRRORED_TENSOR_CASTS(T)
MIRRORED_TENSOR(float)
MIRRORED_TENSOR(double)
MIRRORED_TENSOR(int32_t)
MIRRORED_TENSOR(int64_t)
MIRRORED_TENSOR(uint8_t)
MIRRORED_TENSOR(float16)
MIRRORED_TENSOR(bfloat16)
#undef MIRRORED_TENSOR
#undef MIRRORED_TENSOR_CASTS

}  // namespace mirrored
