#pragma once
/// \file
/// `detail::VariableAccess`: the library's access to a variable's state and copies. Apart from
/// <mirrored/variable.hpp> so that <mirrored/strategy.hpp> can define its variable-level member
/// templates (`experimental_local_results`, `StrategyExtended::update`, ...) without including
/// the variable header, which includes it: every member here only names `Variable<T>` and
/// `VariableState<T>` through its template parameter, so they are complete where it is used.

#include <cstddef>
#include <functional>
#include <utility>

#include "mirrored/shape.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {

class Strategy;
struct VariableOptions;
template <class T>
class Variable;

namespace detail {

template <class T>
struct VariableState;

/// Library-internal access to variable components.
struct VariableAccess {
  /// A handle naming copy `r` of `v` alone: writes through it touch only that copy.
  template <class T>
  static Variable<T> component(const Variable<T>& v, int r) {
    return Variable<T>(v.state_, v.component_ >= 0 ? v.component_ : r);
  }
  template <class T>
  static VariableState<T>& state(const Variable<T>& v) {
    return *v.state_;
  }
  /// Index of the copy a component view names (-1 for a whole variable).
  template <class T>
  static int component_index(const Variable<T>& v) noexcept {
    return v.component_;
  }
  /// Replaces copy `r` with `t` (no copy, no aggregation): for optimizers that computed the new
  /// value into a fresh tensor on the copy's device.
  template <class T>
  static void set_component(const Variable<T>& v, std::size_t r, Tensor<T> t) {
    v.state_->set(r, std::move(t));
  }
  /// Phase one of a cross-replica `v.assign(value)`: every check it makes and every copy it needs
  /// (one per replica device), but nothing stored. Returns phase two, which stores the copies and
  /// does nothing that can fail, so that a caller assigning many variables can check and copy all
  /// of them before changing any (checkpoint::restore). \throws what `assign` throws.
  template <class T>
  static std::function<void()> prepare_assign(const Variable<T>& v, const Tensor<T>& value) {
    return v.prepare_assign(value);
  }
  /// A new sharded variable of `shape` (see `Variable::is_sharded`) of strategy `s`, every element
  /// `value`: inside its `run` made once (every replica calls this and gets the same variable), in
  /// cross-replica context at once. Compiled for every element type (src/variables/).
  template <class T>
  static Variable<T> sharded_full(Strategy& s, const Shape& shape, T value, const VariableOptions& o);
};

}  // namespace detail
}  // namespace mirrored
