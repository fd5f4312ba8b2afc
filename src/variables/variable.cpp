#include "mirrored/variable.hpp"

#include "runtime/default_strategy.hpp"
#include "runtime/thread_state.hpp"

namespace mirrored {

const char* variable_aggregation_name(VariableAggregation a) noexcept {
  switch (a) {
    case VariableAggregation::NONE: return "NONE";
    case VariableAggregation::SUM: return "SUM";
    case VariableAggregation::MEAN: return "MEAN";
    case VariableAggregation::ONLY_FIRST_REPLICA: return "ONLY_FIRST_REPLICA";
  }
  return "UNKNOWN";
}

const char* variable_synchronization_name(VariableSynchronization s) noexcept {
  switch (s) {
    case VariableSynchronization::AUTO: return "AUTO";
    case VariableSynchronization::NONE: return "NONE";
    case VariableSynchronization::ON_WRITE: return "ON_WRITE";
    case VariableSynchronization::ON_READ: return "ON_READ";
  }
  return "UNKNOWN";
}

namespace detail {

VariablePlace locate_variable(const Strategy* owner, const std::string& name, const char* op, bool write) {
  const auto& ts = thread_state();
  if (ts.replica && !is_default_context(ts.replica)) {
    Strategy& current = ts.replica->strategy();
    if (&current == owner) return {true, local_replica_index(*ts.replica)};
    if (write) {
      throw FailedPreconditionError(str_cat("Mixing different tf.distribute.Strategy objects: variable '", name,
                                            "' belongs to ", owner ? owner->name() : std::string("no strategy"),
                                            " but Variable::", op, " was called inside the run of another ",
                                            current.name()));
    }
    return {false, -1};
  }
  if (write && owner && has_strategy() && &get_strategy() != owner) {
    throw FailedPreconditionError(str_cat("Mixing different tf.distribute.Strategy objects: variable '", name,
                                          "' belongs to ", owner->name(), " but Variable::", op,
                                          " was called in the scope of another ", get_strategy().name()));
  }
  return {false, -1};
}

void check_variable_options(const VariableOptions& o, const std::string& dtype, bool integer, bool distributed) {
  if (distributed && o.synchronization == VariableSynchronization::NONE) {
    throw InvalidArgumentError(
        "`NONE` variable synchronization mode is not supported with tf.distribute strategy. "
        "Please change the `synchronization` for variable: " +
        o.name);
  }
  if (integer && o.aggregation == VariableAggregation::MEAN) {
    throw InvalidArgumentError("Variable '" + o.name + "' of dtype " + dtype +
                               " cannot use aggregation MEAN: the mean of integers is not an integer (use SUM or "
                               "ONLY_FIRST_REPLICA, or a floating dtype)");
  }
}

void throw_strategy_destroyed(const std::string& name, const std::string& strategy, const char* op) {
  throw FailedPreconditionError(str_cat("Variable '", name, "'.", op, ": the variable belongs to ", strategy,
                                        ", which has been destroyed; a variable cannot be used after its strategy "
                                        "is gone (create it in the scope of the strategy that uses it)"));
}

std::string component_name(const std::string& name, int replica) {
  return replica == 0 ? name + ":0" : name + "/replica_" + std::to_string(replica) + ":0";
}

}  // namespace detail
}  // namespace mirrored
