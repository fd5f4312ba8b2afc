#pragma once
/// \file
/// Optimizers (`SGD`, `Adam`, `AdamW`, `RMSprop`, `Adagrad`) that aggregate gradients across replicas. Called inside
/// `Strategy::run`, `apply_gradients` all-reduces the gradients (SUM, packed into few
/// collectives) and every replica applies the same update to its own copy of each variable, so
/// mirrored variables stay identical. Called outside any strategy it updates plain variables.
///
/// The built-in optimizers update fused, and inside `run` the gradients' sum and the update are
/// one collective of the library (`detail::apply_optimizer_step`): on CPU replicas each replica
/// sums its slice of every gradient and updates that slice of every copy while the sum is in
/// cache (one pass over memory); elsewhere the copies of one replica are laid out as packs of
/// segments (parameter, gradient, slots) and each pack is one `DeviceBackend::apply_optimizer`
/// pass on the replica's device ("multi-tensor apply"): one vectorised loop per pack on the host,
/// one kernel per pack on a GPU, where nothing goes to the host and back (the step count stays
/// on the device too). With `shard_optimizer_state` each replica keeps and updates only its slice
/// of the slots (reduce-scatter, update, all-gather). On the host the results are bitwise those
/// of the per-variable `update` below, whichever path; on CUDA they may differ in the last bits
/// (contracted multiply-adds).

#include <optional>
#include <string>
#include <vector>

#include "mirrored/detail/optimizer_update.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/optimizer.hpp"

namespace mirrored::optimizers {

/// A built-in optimizer: one kind of <mirrored/detail/optimizer_formulas.hpp> with its
/// hyperparameters (`parameters()`). Its slots, their initial values, its per-variable update and
/// its fused update all come from that one description.
template <class T>
class FormulaOptimizer : public Optimizer<T> {
 protected:
  explicit FormulaOptimizer(bool shard_optimizer_state) { this->shard_optimizer_state_ = shard_optimizer_state; }
  /// The kind and hyperparameters.
  virtual detail::OptimizerUpdate parameters() const noexcept = 0;

  // From the kind's formula (compiled with the class, src/variables/optimizers.cpp).
  std::vector<std::string> slot_names() const override;
  double initial_slot_value(std::size_t k) const override;
  void update(T* w, const T* g, std::vector<T*>& slots, int64_t n, int64_t step) override;
  // Not parameters() itself: a subclass may decline the fused path, and the per-variable one still runs.
  std::optional<detail::OptimizerUpdate> fused_update() const override { return parameters(); }
};

/// Options of `SGD` (Keras' defaults).
struct SGDOptions {
  double learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  /// Keep each replica's slice of the slots only (ZeRO-1/2, PyTorch's ZeroRedundancyOptimizer;
  /// beyond TF): see `Optimizer::shard_optimizer_state_`. The weights stay bitwise those of the
  /// unsharded optimizer on CPU replicas.
  bool shard_optimizer_state = false;
};

/// Stochastic gradient descent with optional (Nesterov) momentum, as Keras defines it:
/// `velocity = momentum * velocity - lr * g`; `w += velocity` (Nesterov:
/// `w += momentum * velocity - lr * g`); without momentum `w -= lr * g`. Slot: `momentum` (with
/// momentum).
template <class T = float>
class SGD : public FormulaOptimizer<T> {
 public:
  /// \throws InvalidArgumentError for a negative learning rate or a momentum outside [0, 1].
  explicit SGD(SGDOptions o = {}) : FormulaOptimizer<T>(o.shard_optimizer_state), o_(o) {
    MIRRORED_ENFORCE(o.learning_rate >= 0, InvalidArgumentError, "SGD: learning_rate must be >= 0, got ",
                     o.learning_rate);
    MIRRORED_ENFORCE(o.momentum >= 0 && o.momentum <= 1, InvalidArgumentError, "SGD: momentum must be in [0, 1], got ",
                     o.momentum);
  }
  const SGDOptions& options() const noexcept { return o_; }

 protected:
  detail::OptimizerUpdate parameters() const noexcept override {
    detail::OptimizerUpdate u;
    u.kind = o_.momentum > 0 ? (o_.nesterov ? detail::OptimizerKind::sgd_nesterov : detail::OptimizerKind::sgd_momentum)
                             : detail::OptimizerKind::sgd;
    u.learning_rate = o_.learning_rate;
    u.momentum = o_.momentum;
    return u;
  }

 private:
  SGDOptions o_;
};

/// Options of `Adam` (Keras' defaults).
struct AdamOptions {
  double learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  /// Keep each replica's slice of m and v only (see SGDOptions::shard_optimizer_state).
  bool shard_optimizer_state = false;
};

/// Adam, as Keras defines it: `m += (g - m)(1 - β1)`, `v += (g² - v)(1 - β2)`,
/// `w -= lr·√(1-β2^t)/(1-β1^t) · m / (√v + ε)`. Slots: `m`, `v`.
template <class T = float>
class Adam : public FormulaOptimizer<T> {
 public:
  /// \throws InvalidArgumentError for a negative learning rate or epsilon, or betas outside [0, 1).
  explicit Adam(AdamOptions o = {}) : FormulaOptimizer<T>(o.shard_optimizer_state), o_(o) {
    MIRRORED_ENFORCE(o.learning_rate >= 0 && o.epsilon >= 0, InvalidArgumentError,
                     "Adam: learning_rate and epsilon must be >= 0, got ", o.learning_rate, " and ", o.epsilon);
    MIRRORED_ENFORCE(o.beta_1 >= 0 && o.beta_1 < 1 && o.beta_2 >= 0 && o.beta_2 < 1, InvalidArgumentError,
                     "Adam: beta_1 and beta_2 must be in [0, 1), got ", o.beta_1, " and ", o.beta_2);
  }
  const AdamOptions& options() const noexcept { return o_; }

 protected:
  detail::OptimizerUpdate parameters() const noexcept override {
    detail::OptimizerUpdate u;
    u.kind = detail::OptimizerKind::adam;
    u.learning_rate = o_.learning_rate;
    u.beta_1 = o_.beta_1;
    u.beta_2 = o_.beta_2;
    u.epsilon = o_.epsilon;
    return u;
  }

 private:
  AdamOptions o_;
};

/// Options of `AdamW` (Keras' defaults).
struct AdamWOptions {
  double learning_rate = 0.001;
  double weight_decay = 0.004;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  /// Keep each replica's slice of m and v only (see SGDOptions::shard_optimizer_state).
  bool shard_optimizer_state = false;
};

/// Adam with decoupled weight decay, as Keras' `AdamW` defines it: first
/// `w -= w · weight_decay · lr` (the learning rate before bias correction), then Adam's update
/// of the decayed `w`. Every variable is decayed (Keras' `exclude_from_weight_decay` is not
/// offered). Slots: `m`, `v`.
template <class T = float>
class AdamW : public FormulaOptimizer<T> {
 public:
  /// \throws InvalidArgumentError for a negative learning rate, weight decay or epsilon, or betas
  /// outside [0, 1).
  explicit AdamW(AdamWOptions o = {}) : FormulaOptimizer<T>(o.shard_optimizer_state), o_(o) {
    MIRRORED_ENFORCE(o.learning_rate >= 0 && o.epsilon >= 0 && o.weight_decay >= 0, InvalidArgumentError,
                     "AdamW: learning_rate, weight_decay and epsilon must be >= 0, got ", o.learning_rate, ", ",
                     o.weight_decay, " and ", o.epsilon);
    MIRRORED_ENFORCE(o.beta_1 >= 0 && o.beta_1 < 1 && o.beta_2 >= 0 && o.beta_2 < 1, InvalidArgumentError,
                     "AdamW: beta_1 and beta_2 must be in [0, 1), got ", o.beta_1, " and ", o.beta_2);
  }
  const AdamWOptions& options() const noexcept { return o_; }

 protected:
  detail::OptimizerUpdate parameters() const noexcept override {
    detail::OptimizerUpdate u;
    u.kind = detail::OptimizerKind::adamw;
    u.learning_rate = o_.learning_rate;
    u.beta_1 = o_.beta_1;
    u.beta_2 = o_.beta_2;
    u.epsilon = o_.epsilon;
    u.weight_decay = o_.weight_decay;
    return u;
  }

 private:
  AdamWOptions o_;
};

/// Options of `RMSprop` (Keras' defaults).
struct RMSpropOptions {
  double learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  /// Normalise by the gradient's variance (its second moment less its mean squared) instead of its
  /// second moment.
  bool centered = false;
  /// Keep each replica's slice of the slots only (see SGDOptions::shard_optimizer_state).
  bool shard_optimizer_state = false;
};

/// RMSprop, as Keras 3 defines it: `velocity = ρ·velocity + (1−ρ)·g²`; centered:
/// `average_gradient = ρ·average_gradient + (1−ρ)·g` and the denominator
/// `velocity − average_gradient² + ε`, else `velocity + ε`; `increment = lr·g / √denominator`;
/// with momentum `momentum = momentum_coefficient·momentum + increment`, `w −= momentum`, else
/// `w −= increment`. Slots: `velocity`, `momentum` (momentum > 0), `average_gradient` (centered),
/// all starting at zero.
template <class T = float>
class RMSprop : public FormulaOptimizer<T> {
 public:
  /// \throws InvalidArgumentError for a negative learning rate, momentum or epsilon, or `rho`
  /// outside [0, 1).
  explicit RMSprop(RMSpropOptions o = {}) : FormulaOptimizer<T>(o.shard_optimizer_state), o_(o) {
    MIRRORED_ENFORCE(o.learning_rate >= 0, InvalidArgumentError, "RMSprop: learning_rate must be >= 0, got ",
                     o.learning_rate);
    MIRRORED_ENFORCE(o.rho >= 0 && o.rho < 1, InvalidArgumentError, "RMSprop: rho must be in [0, 1), got ", o.rho);
    MIRRORED_ENFORCE(o.momentum >= 0, InvalidArgumentError, "RMSprop: momentum must be >= 0, got ", o.momentum);
    MIRRORED_ENFORCE(o.epsilon >= 0, InvalidArgumentError, "RMSprop: epsilon must be >= 0, got ", o.epsilon);
  }
  const RMSpropOptions& options() const noexcept { return o_; }

 protected:
  detail::OptimizerUpdate parameters() const noexcept override {
    using detail::OptimizerKind;
    detail::OptimizerUpdate u;
    const bool momentum = o_.momentum > 0;
    u.kind = o_.centered ? (momentum ? OptimizerKind::rmsprop_centered_momentum : OptimizerKind::rmsprop_centered)
                         : (momentum ? OptimizerKind::rmsprop_momentum : OptimizerKind::rmsprop);
    u.learning_rate = o_.learning_rate;
    u.rho = o_.rho;
    u.momentum = o_.momentum;
    u.epsilon = o_.epsilon;
    return u;
  }

 private:
  RMSpropOptions o_;
};

/// Options of `Adagrad` (Keras' defaults).
struct AdagradOptions {
  double learning_rate = 0.001;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;
  /// Keep each replica's slice of the accumulator only (see SGDOptions::shard_optimizer_state).
  bool shard_optimizer_state = false;
};

/// Adagrad, as Keras 3 defines it: `accumulator += g²`; `w −= lr·g / √(accumulator + ε)`. Slot:
/// `accumulator`, starting at `initial_accumulator_value`.
template <class T = float>
class Adagrad : public FormulaOptimizer<T> {
 public:
  /// \throws InvalidArgumentError for a negative learning rate, initial_accumulator_value or epsilon.
  explicit Adagrad(AdagradOptions o = {}) : FormulaOptimizer<T>(o.shard_optimizer_state), o_(o) {
    MIRRORED_ENFORCE(o.learning_rate >= 0, InvalidArgumentError, "Adagrad: learning_rate must be >= 0, got ",
                     o.learning_rate);
    MIRRORED_ENFORCE(o.initial_accumulator_value >= 0, InvalidArgumentError,
                     "Adagrad: initial_accumulator_value must be >= 0, got ", o.initial_accumulator_value);
    MIRRORED_ENFORCE(o.epsilon >= 0, InvalidArgumentError, "Adagrad: epsilon must be >= 0, got ", o.epsilon);
  }
  const AdagradOptions& options() const noexcept { return o_; }

 protected:
  detail::OptimizerUpdate parameters() const noexcept override {
    detail::OptimizerUpdate u;
    u.kind = detail::OptimizerKind::adagrad;
    u.learning_rate = o_.learning_rate;
    u.initial_accumulator_value = o_.initial_accumulator_value;
    u.epsilon = o_.epsilon;
    return u;
  }

 private:
  AdagradOptions o_;
};

// Compiled for float and double in src/variables/optimizers.cpp (their vtables and members).
extern template class FormulaOptimizer<float>;
extern template class FormulaOptimizer<double>;
extern template class SGD<float>;
extern template class SGD<double>;
extern template class Adam<float>;
extern template class Adam<double>;
extern template class AdamW<float>;
extern template class AdamW<double>;
extern template class RMSprop<float>;
extern template class RMSprop<double>;
extern template class Adagrad<float>;
extern template class Adagrad<double>;

}  // namespace mirrored::optimizers
