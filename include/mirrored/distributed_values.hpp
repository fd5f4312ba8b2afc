#pragma once
/// \file
/// Distributed values: one component per replica, in replica order.

#include <cstddef>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/errors.hpp"
#include "mirrored/repr.hpp"

namespace mirrored {

namespace detail {
/// `Name:{\n  0: <v0>,\n  1: <v1>\n}` from the components' printed forms (`items`).
std::string join_distributed(const char* name, const std::vector<std::string>& items);
/// Writes `name`'s printed form of `items` (as `join_distributed`) to `os`.
std::ostream& print_distributed(std::ostream& os, const char* name, const std::vector<std::string>& items);
/// The components' printed forms (`repr`).
template <class T>
std::vector<std::string> component_reprs(const std::vector<T>& values) {
  std::vector<std::string> items(values.size());
  for (std::size_t r = 0; r < values.size(); ++r) items[r] = repr(values[r]);
  return items;
}
}  // namespace detail

/// One value per replica (e.g. what `Strategy::run` returns). Components may differ.
template <class T>
class PerReplica {
 public:
  using value_type = T;
  /// Wraps one value per replica, in replica order. \throws InvalidArgumentError when empty.
  explicit PerReplica(std::vector<T> values) : values_(std::move(values)) {
    MIRRORED_ENFORCE(!values_.empty(), InvalidArgumentError, "PerReplica needs at least one component");
  }
  /// Number of components (replicas).
  std::size_t size() const noexcept { return values_.size(); }
  /// Component of replica `r`. \throws OutOfRangeError when `r >= size()`.
  typename std::vector<T>::const_reference operator[](std::size_t r) const {
    MIRRORED_ENFORCE(r < values_.size(), OutOfRangeError, "PerReplica: replica ", r, " out of range for ",
                     values_.size(), " replicas");
    return values_[r];
  }
  /// All components in replica order.
  const std::vector<T>& values() const noexcept { return values_; }

  friend std::ostream& operator<<(std::ostream& os, const PerReplica& v) {
    return detail::print_distributed(os, "PerReplica", detail::component_reprs(v.values_));
  }

 private:
  std::vector<T> values_;
};

/// One value per replica, all equal (e.g. the result of an all-reduce).
template <class T>
class Mirrored {
 public:
  using value_type = T;
  /// Wraps the replicas' copies, in replica order. \throws InvalidArgumentError when empty.
  explicit Mirrored(std::vector<T> values) : values_(std::move(values)) {
    MIRRORED_ENFORCE(!values_.empty(), InvalidArgumentError, "Mirrored needs at least one component");
  }
  std::size_t size() const noexcept { return values_.size(); }
  /// Copy held by replica `r`. \throws OutOfRangeError when `r >= size()`.
  typename std::vector<T>::const_reference operator[](std::size_t r) const {
    MIRRORED_ENFORCE(r < values_.size(), OutOfRangeError, "Mirrored: replica ", r, " out of range for ", values_.size(),
                     " replicas");
    return values_[r];
  }
  const std::vector<T>& values() const noexcept { return values_; }

  friend std::ostream& operator<<(std::ostream& os, const Mirrored& v) {
    return detail::print_distributed(os, "Mirrored", detail::component_reprs(v.values_));
  }

 private:
  std::vector<T> values_;
};

/// True for `PerReplica<X>` and `Mirrored<X>`.
template <class X>
inline constexpr bool is_distributed_v = false;
template <class T>
inline constexpr bool is_distributed_v<PerReplica<T>> = true;
template <class T>
inline constexpr bool is_distributed_v<Mirrored<T>> = true;

}  // namespace mirrored
