#pragma once
/// \file
/// Dataset elements: `Tensor<T>` or `std::tuple<Tensor<Ts>...>` (e.g. features and labels).
/// Type traits, the typed element spec, and the row operations (slice, stack) that `batch`,
/// `from_tensor_slices` and the distributed split are built on. Everything here except
/// `ElementSpec` and `is_element_v` is internal (`detail`).

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/data/tensor_spec.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::data {

namespace detail {

using UntypedTensor = ::mirrored::detail::UntypedTensor;

template <class X>
struct element_traits {
  static constexpr bool valid = false;
};
template <class T>
struct element_traits<Tensor<T>> {
  static constexpr bool valid = true;
  static constexpr std::size_t size = 1;
  using spec_type = TensorSpec;
};
template <class... Ts>
struct element_traits<std::tuple<Tensor<Ts>...>> {
  static constexpr bool valid = sizeof...(Ts) > 0;
  static constexpr std::size_t size = sizeof...(Ts);
  template <class>
  using as_spec = TensorSpec;
  using spec_type = std::tuple<as_spec<Ts>...>;
};

}  // namespace detail

/// True for the element types a `Dataset` may hold: `Tensor<T>` and non-empty
/// `std::tuple<Tensor<Ts>...>`.
template <class X>
inline constexpr bool is_element_v = detail::element_traits<X>::valid;

/// What `element_spec()` returns for element type `E`: a `TensorSpec` for `Tensor<T>`, a
/// `std::tuple` of `TensorSpec`s (one per component) for a tuple of tensors.
template <class E>
using ElementSpec = typename detail::element_traits<E>::spec_type;

namespace detail {

/// Number of tensor components of an element.
template <class E>
inline constexpr std::size_t num_components_v = element_traits<E>::size;

/// The element's components as untyped tensors (sharing storage), in tuple order.
template <class E>
std::vector<UntypedTensor> erase_element(const E& e) {
  if constexpr (is_tensor_v<E>) {
    return {::mirrored::detail::TensorAccess::erase(e)};
  } else {
    return std::apply(
        [](const auto&... t) { return std::vector<UntypedTensor>{::mirrored::detail::TensorAccess::erase(t)...}; }, e);
  }
}

/// Rebuilds an element from components made by `erase_element` (or the row operations below).
template <class E>
E restore_element(const std::vector<UntypedTensor>& parts) {
  if constexpr (is_tensor_v<E>) {
    return ::mirrored::detail::TensorAccess::restore<typename E::value_type>(parts[0]);
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return E{::mirrored::detail::TensorAccess::restore<typename std::tuple_element_t<I, E>::value_type>(parts[I])...};
    }
    (std::make_index_sequence<num_components_v<E>>{});
  }
}

/// The dtypes of an element's components.
template <class E>
std::vector<DType> element_dtypes() {
  if constexpr (is_tensor_v<E>) {
    return {E::dtype()};
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::vector<DType>{std::tuple_element_t<I, E>::dtype()...};
    }
    (std::make_index_sequence<num_components_v<E>>{});
  }
}

/// Converts per-component specs into the typed `ElementSpec<E>`.
template <class E>
ElementSpec<E> make_element_spec(const std::vector<TensorSpec>& specs) {
  if constexpr (std::is_same_v<ElementSpec<E>, TensorSpec>) {
    return specs.at(0);
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return ElementSpec<E>{specs.at(I)...}; }
    (std::make_index_sequence<num_components_v<E>>{});
  }
}

/// Rows `[begin, end)` of `t` along axis 0 as a new tensor on `dst` (one copy). When the range is
/// all of `t` and `dst` is `t`'s device, `t` itself is returned (shared, no copy).
/// \throws InvalidArgumentError for a rank-0 tensor or a range outside `[0, t.shape[0]]`.
UntypedTensor slice_rows(const UntypedTensor& t, int64_t begin, int64_t end, const Device& dst);
/// Row `i` of `t` (its shape without the first dimension), on `t`'s device.
/// \throws InvalidArgumentError as `slice_rows`.
UntypedTensor row_of(const UntypedTensor& t, int64_t i);
/// Stacks equally shaped tensors into one of shape `[items.size(), shape...]` on the host (a
/// batch). `component` only names the component in the error.
/// \throws InvalidArgumentError when the shapes differ ("Cannot batch tensors with different
/// shapes in component 0. First element had shape (2,) and element 1 had shape (3,).").
UntypedTensor stack_rows(const std::vector<UntypedTensor>& items, std::size_t component);
/// The rows of `parts`, one after the other, as one tensor on the host (the inverse of cutting a
/// batch into slices). `component` only names the component in the error.
/// \throws InvalidArgumentError for a rank-0 part, or parts whose dtypes or dimensions after the
/// first differ.
UntypedTensor concat_rows(const std::vector<UntypedTensor>& parts, std::size_t component);
/// A tensor shaped like `t` but with 0 rows (an empty batch), on `dst`.
/// \throws InvalidArgumentError for a rank-0 tensor.
UntypedTensor empty_rows_like(const UntypedTensor& t, const Device& dst);
/// `t` on `dst`: `t` itself when it is already there, else a copy.
UntypedTensor on_device(const UntypedTensor& t, const Device& dst);

}  // namespace detail
}  // namespace mirrored::data
