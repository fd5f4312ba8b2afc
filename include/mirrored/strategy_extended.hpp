#pragma once
/// \file
/// The variable-level part of `StrategyExtended`: `update`, `reduce_to`, `batch_reduce_to`,
/// `variable_created_in_scope` (declared in strategy.hpp).

#include <utility>
#include <vector>

#include "mirrored/strategy.hpp"
#include "mirrored/variable.hpp"

namespace mirrored {

template <class T>
bool StrategyExtended::variable_created_in_scope(const Variable<T>& v) const noexcept {
  return detail::VariableAccess::state(v).belongs_to(&s_);
}

template <class T, class Fn, class... Args>
auto StrategyExtended::update(const Variable<T>& var, Fn&& fn, Args&&... args) {
  require_cross_replica("update");
  (s_.check_components("update", args), ...);
  Strategy* owner = detail::VariableAccess::state(var).live_strategy("update");
  if (owner != &s_) {
    throw FailedPreconditionError("Mixing different tf.distribute.Strategy objects: StrategyExtended::update of " +
                                  s_.name() + " was given variable '" + var.name() + "' of " +
                                  (owner ? owner->name() : std::string("no strategy")));
  }
  const int n = static_cast<int>(worker_devices().size());  // this process's copies
  using R = std::invoke_result_t<Fn&, Variable<T>&, detail::replica_arg_t<std::remove_reference_t<Args>>...>;
  if constexpr (std::is_void_v<R>) {
    for (int r = 0; r < n; ++r) {
      Variable<T> component = detail::VariableAccess::component(var, r);
      std::invoke(fn, component, detail::replica_arg(args, r)...);
    }
  } else {
    std::vector<std::decay_t<R>> out;
    for (int r = 0; r < n; ++r) {
      Variable<T> component = detail::VariableAccess::component(var, r);
      out.push_back(std::invoke(fn, component, detail::replica_arg(args, r)...));
    }
    return PerReplica<std::decay_t<R>>(std::move(out));
  }
}

template <class T>
Tensor<T> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value, const Device& destination,
                                      const CommunicationOptions& options) {
  require_cross_replica("reduce_to");
  s_.check_components("reduce_to", value);
  std::vector<std::vector<detail::UntypedTensor>> values(1);
  for (const auto& t : value.values()) values[0].push_back(detail::TensorAccess::erase(t));
  return detail::TensorAccess::restore<T>(batch_reduce_onto("reduce_to", op, values, {{destination}}, options)[0][0]);
}

template <class T>
Mirrored<Tensor<T>> StrategyExtended::reduce_to(ReduceOp op, const PerReplica<Tensor<T>>& value,
                                                const Variable<T>& destinations, const CommunicationOptions& options) {
  return batch_reduce_to<T>(op, {{value, destinations}}, options)[0];
}

template <class T>
std::vector<Mirrored<Tensor<T>>> StrategyExtended::batch_reduce_to(
    ReduceOp op, const std::vector<std::pair<PerReplica<Tensor<T>>, Variable<T>>>& value_destination_pairs,
    const CommunicationOptions& options) {
  require_cross_replica("batch_reduce_to");
  std::vector<std::vector<detail::UntypedTensor>> values;
  values.reserve(value_destination_pairs.size());
  for (const auto& [value, destination] : value_destination_pairs) {
    s_.check_components("batch_reduce_to", value);
    auto& parts = values.emplace_back();
    for (const auto& t : value.values()) parts.push_back(detail::TensorAccess::erase(t));
  }
  std::vector<std::vector<Device>> destinations;
  destinations.reserve(value_destination_pairs.size());
  for (const auto& [value, destination] : value_destination_pairs) {
    auto& devices = destinations.emplace_back();
    for (const auto& c : destination.components()) devices.push_back(c.device());
  }
  const auto reduced = batch_reduce_onto("batch_reduce_to", op, values, destinations, options);
  std::vector<Mirrored<Tensor<T>>> out;
  out.reserve(reduced.size());
  for (const auto& copies_erased : reduced) {
    std::vector<Tensor<T>> copies;
    copies.reserve(copies_erased.size());
    for (const auto& c : copies_erased) copies.push_back(detail::TensorAccess::restore<T>(c));
    out.emplace_back(std::move(copies));
  }
  return out;
}

}  // namespace mirrored
