#pragma once
/// \file
/// Needed by the optimizers' fused update (<mirrored/optimizers.hpp>): one replica's part of an
/// optimizer step, type-erased, as the optimizer hands it to the library, which reduces the
/// gradients across replicas (or not) and updates the copies in place, in one collective.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/untyped_tensor.hpp"

namespace mirrored {
class ReplicaContext;
}  // namespace mirrored

namespace mirrored::detail {

/// One variable's slot copies or slices in an optimizer step: slot k of the kind
/// (`optimizer_slot_count`), empty past them.
using SlotTensors = std::array<UntypedTensor, kMaxOptimizerSlots>;

/// One replica's part of `Optimizer::apply_gradients` with a fused update. Every tensor is this
/// replica's, taken out of its variable (nobody else holds it), and is updated in place.
struct OptimizerStep {
  DType dtype = DType::float32;  ///< float32 or float64: every gradient, parameter and slot
  OptimizerUpdate update;
  /// True: the gradients are summed across every replica first (false: skip_gradients_aggregation,
  /// they are applied as given).
  bool aggregate = true;
  /// True: `slots` hold this replica's slice of each variable's slots (the BALANCED piece of the
  /// flattened variable, by global replica index), and each replica updates only that slice of
  /// the parameters, then every copy gets every slice. False: full slots, every copy updated.
  bool sharded = false;
  /// False: one reduction per gradient (`Optimizer::pack_gradients`), else packs of
  /// `communication.bytes_per_pack`.
  bool pack = true;
  /// per variable: its identity (the state every copy shares) and its name, which every replica
  /// must pass in the same order (checked with the other arguments, before any byte moves)
  std::vector<const void*> variables;
  std::vector<const std::string*> names;
  std::vector<UntypedTensor> grads;    ///< per variable: this replica's gradient (any device)
  std::vector<UntypedTensor> params;   ///< per variable: this replica's copy
  std::vector<SlotTensors> slots;      ///< per variable: slot copies or slices
  UntypedTensor step_in;               ///< int64 scalar: the updates applied so far (this replica's counter)
  UntypedTensor step_out;              ///< int64 scalar on step_in's device: receives the new count
  CommunicationOptions communication;  ///< the optimizer's (pack size, timeout, compression)
};

/// Runs `step`: inside `run`, `ctx` is the calling replica's context and every replica of every
/// worker calls this with the same variables in the same order (a collective, checked like one:
/// counts, dtypes, shapes, the optimizer and its hyperparameters, `sharded`, `aggregate`, the
/// options); `ctx` null updates a plain variable's copies, with nothing to reduce. \throws
/// InvalidArgumentError when replicas disagree; what collectives throw.
void apply_optimizer_step(ReplicaContext* ctx, OptimizerStep& step);

/// Inside `run`: every replica of every worker passes the variables of its `op` call (`ids`: the
/// state its copies share, compared within this process; `names`, compared across workers) in
/// the same order, before any variable is made or any byte moves. A rendezvous of every replica.
/// \throws InvalidArgumentError on every replica, naming `op`, the first replica whose list
/// differs from replica 0's and both lists; what collectives throw.
void agree_on_variables(ReplicaContext& ctx, const char* op, const std::vector<const void*>& ids,
                        const std::vector<std::string>& names);

}  // namespace mirrored::detail
