#pragma once
/// \file
/// The optimizer kinds the library updates fused and their hyperparameters: what the device
/// backends' fused update (<mirrored/detail/device_backend.hpp>) and the built-in optimizers
/// (<mirrored/optimizers.hpp>) name. Each kind's formula is in
/// <mirrored/detail/optimizer_formulas.hpp>, which the compiled library and the CUDA kernels
/// include; this part needs no <cmath>. nvcc compiles it for the device too.

#include <cstdint>

namespace mirrored::detail {

/// The optimizer kinds the library updates fused (`DeviceBackend::apply_optimizer`). The formula
/// of each is the type in `OptimizerFormulas` whose `kind` it is.
enum class OptimizerKind : unsigned char {
  sgd,
  sgd_momentum,
  sgd_nesterov,
  adam,
  adamw,
  rmsprop,
  rmsprop_momentum,
  rmsprop_centered,
  rmsprop_centered_momentum,
  adagrad,
};

/// The most slots any kind keeps per variable (RMSprop, centered and with momentum).
inline constexpr int kMaxOptimizerSlots = 3;

/// The hyperparameters of a fused optimizer update, in double as the user gave them; each formula
/// reads those of its kind and converts them to the variable's type.
struct OptimizerUpdate {
  OptimizerKind kind = OptimizerKind::sgd;
  double learning_rate = 0;
  double momentum = 0;  ///< SGD's and RMSprop's momentum coefficient
  double beta_1 = 0;
  double beta_2 = 0;
  double epsilon = 0;
  double weight_decay = 0;
  double rho = 0;                        ///< RMSprop's discount
  double initial_accumulator_value = 0;  ///< Adagrad's first accumulator
  bool operator==(const OptimizerUpdate&) const = default;
};

}  // namespace mirrored::detail
