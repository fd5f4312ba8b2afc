#pragma once
/// \file
/// Nests: values made of tensors and numbers inside `std::vector`, `std::tuple` and
/// `std::map<std::string, …>`. Reductions flatten a nest into type-erased tensors, work leaf by
/// leaf, and rebuild a nest of the same structure.
/// Needed by `Strategy::run`, `reduce` and `gather` (<mirrored/strategy.hpp>), `ReplicaContext`'s
/// collectives (<mirrored/replica_context.hpp>), `PendingCollective<V>` and the input pipeline's
/// prefetcher.

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::detail {

/// Tensor element type that stores a number of type `S` (`int` → int32_t, `long` → int64_t, …).
template <class S>
struct scalar_element {
  static_assert(std::is_arithmetic_v<S> && !std::is_same_v<S, bool>, "not a numeric scalar");
  using type = std::conditional_t<
      std::is_floating_point_v<S>, std::conditional_t<(sizeof(S) <= 4), float, double>,
      std::conditional_t<std::is_same_v<S, uint8_t>, uint8_t, std::conditional_t<(sizeof(S) <= 4), int32_t, int64_t>>>;
};
template <class S>
using scalar_element_t = typename scalar_element<S>::type;

template <class X>
inline constexpr bool is_scalar_leaf_v = std::is_arithmetic_v<X> && !std::is_same_v<X, bool>;
template <class X>
inline constexpr bool is_leaf_v = is_tensor_v<X> || is_scalar_leaf_v<X>;

template <class X>
struct is_vector : std::false_type {};
template <class X, class A>
struct is_vector<std::vector<X, A>> : std::true_type {};
template <class X>
struct is_string_map : std::false_type {};
template <class X, class C, class A>
struct is_string_map<std::map<std::string, X, C, A>> : std::true_type {};
template <class X>
struct is_tuple : std::false_type {};
template <class... Xs>
struct is_tuple<std::tuple<Xs...>> : std::true_type {};

/// Element type a leaf holds.
template <class X>
struct leaf_element;
template <class T>
struct leaf_element<Tensor<T>> {
  using type = T;
};
template <class X>
requires is_scalar_leaf_v<X>
struct leaf_element<X> {
  using type = scalar_element_t<X>;
};

/// The nest `X` with every leaf's element type replaced by `R` (unchanged when `R` is void).
template <class X, class R>
struct rebind_nest;
template <class X>
struct rebind_nest<X, void> {
  using type = X;
};
template <class T, class R>
requires(!std::is_void_v<R>) struct rebind_nest<Tensor<T>, R> {
  using type = Tensor<R>;
};
template <class X, class R>
requires(!std::is_void_v<R> && is_scalar_leaf_v<X>) struct rebind_nest<X, R> {
  using type = R;
};
template <class X, class A, class R>
requires(!std::is_void_v<R>) struct rebind_nest<std::vector<X, A>, R> {
  using type = std::vector<typename rebind_nest<X, R>::type>;
};
template <class X, class C, class A, class R>
requires(!std::is_void_v<R>) struct rebind_nest<std::map<std::string, X, C, A>, R> {
  using type = std::map<std::string, typename rebind_nest<X, R>::type>;
};
template <class... Xs, class R>
requires(!std::is_void_v<R>) struct rebind_nest<std::tuple<Xs...>, R> {
  using type = std::tuple<typename rebind_nest<Xs, R>::type...>;
};
template <class X, class R>
using rebind_nest_t = typename rebind_nest<X, R>::type;

/// True when `X` is a leaf or a vector/tuple/string-map nest of leaves.
template <class X>
constexpr bool is_nest() {
  if constexpr (is_leaf_v<X>)
    return true;
  else if constexpr (is_vector<X>::value)
    return is_nest<typename X::value_type>();
  else if constexpr (is_string_map<X>::value)
    return is_nest<typename X::mapped_type>();
  else if constexpr (is_tuple<X>::value)
    return []<class... Xs>(std::type_identity<std::tuple<Xs...>>) {
      return (is_nest<Xs>() && ...);
    }(std::type_identity<X>{});
  else
    return false;
}

/// True when any leaf of `X` holds integers.
template <class X>
constexpr bool nest_has_integer_leaf() {
  if constexpr (is_leaf_v<X>)
    return !is_floating_element_v<typename leaf_element<X>::type>;
  else if constexpr (is_vector<X>::value)
    return nest_has_integer_leaf<typename X::value_type>();
  else if constexpr (is_string_map<X>::value)
    return nest_has_integer_leaf<typename X::mapped_type>();
  else
    return []<class... Xs>(std::type_identity<std::tuple<Xs...>>) {
      return (nest_has_integer_leaf<Xs>() || ...);
    }(std::type_identity<X>{});
}

/// Appends `leaf` to `leaves` and its mark (`.`) to `structure` (compiled: `flatten`'s every leaf).
void append_leaf(std::vector<UntypedTensor>& leaves, std::string& structure, UntypedTensor leaf);

/// Appends the leaves of `x` in depth-first order (numbers become rank-0 host tensors) and an
/// unambiguous encoding of its structure to `structure`, so that two nests can be compared (equal
/// encodings mean equal structures and leaf counts): a leaf is `.`, a vector `[` its elements `]`,
/// a tuple `(` its elements `)`, a map `{` then per entry the key's length in decimal, `:`, the key
/// and the value's encoding, then `}`. Keys are length-prefixed because they may contain any
/// character: `{"a,b": 1, "c": 2}` must not encode like `{"a": 1, "b,c": 2}`.
template <class X>
void flatten(const X& x, std::vector<UntypedTensor>& leaves, std::string& structure) {
  if constexpr (is_tensor_v<X>) {
    append_leaf(leaves, structure, TensorAccess::erase(x));
  } else if constexpr (is_scalar_leaf_v<X>) {
    append_leaf(leaves, structure,
                TensorAccess::erase(Tensor<scalar_element_t<X>>::scalar(static_cast<scalar_element_t<X>>(x))));
  } else if constexpr (is_vector<X>::value) {
    structure += '[';
    for (const auto& e : x) flatten(e, leaves, structure);
    structure += ']';
  } else if constexpr (is_string_map<X>::value) {
    structure += '{';
    for (const auto& [k, v] : x) {
      structure += std::to_string(k.size());
      structure += ':';
      structure += k;
      flatten(v, leaves, structure);
    }
    structure += '}';
  } else {
    static_assert(is_tuple<X>::value, "not a nest of tensors and numbers");
    structure += '(';
    std::apply([&](const auto&... e) { (flatten(e, leaves, structure), ...); }, x);
    structure += ')';
  }
}

/// Builds a `Target` nest shaped like `source` from `leaves[i…]` (advancing `i`).
template <class Target, class Source>
Target unflatten(const Source& source, const std::vector<UntypedTensor>& leaves, std::size_t& i) {
  if constexpr (is_tensor_v<Target>) {
    return TensorAccess::restore<typename Target::value_type>(leaves[i++]);
  } else if constexpr (is_scalar_leaf_v<Target>) {
    return static_cast<Target>(TensorAccess::restore<scalar_element_t<Target>>(leaves[i++]).item());
  } else if constexpr (is_vector<Target>::value) {
    Target out;
    out.reserve(source.size());
    for (const auto& e : source) out.push_back(unflatten<typename Target::value_type>(e, leaves, i));
    return out;
  } else if constexpr (is_string_map<Target>::value) {
    Target out;
    for (const auto& [k, v] : source) out.emplace(k, unflatten<typename Target::mapped_type>(v, leaves, i));
    return out;
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Braced init keeps the depth-first order of evaluation.
      return Target{unflatten<std::tuple_element_t<I, Target>>(std::get<I>(source), leaves, i)...};
    }
    (std::make_index_sequence<std::tuple_size_v<Target>>{});
  }
}

}  // namespace mirrored::detail
