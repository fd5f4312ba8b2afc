#pragma once
/// \file
/// Every built-in optimizer kind, described once: the scalars it derives from its hyperparameters,
/// its slots (how many, their Keras names, their initial value) and the update of one element.
/// The per-variable update of <mirrored/optimizers.hpp>, the host backend's fused update (which the
/// simulated GPU runs too) and the CUDA kernel all call these functions, and find a kind's formula
/// by its type (`visit_optimizer_formula`), never by the enumerator's number. Adding a kind is an
/// enumerator, a formula and its entry in `OptimizerFormulas`, all in this file.
///
/// Each formula evaluates Keras 3's expression in Keras' order in the variable's type, with every
/// hyperparameter converted to that type once (as Keras converts them), so the host paths agree to
/// the bit. No CUDA header and nothing but <cmath>: nvcc compiles this file for the device too.

#include <cmath>
#include <cstdint>

#include "mirrored/detail/host_device.hpp"
#include "mirrored/detail/optimizer_update.hpp"

namespace mirrored::detail {

/// `learning_rate · sqrt(1 − beta_2^step) / (1 − beta_1^step)` at (1-based) `step`: Adam's
/// bias-corrected step size as Keras computes it, in the variable's type `T`: the learning rate,
/// the betas, their powers, the differences, the root and the quotient are each rounded to `T`.
/// For float that is about 6e-6 (relative) below the exact value in the first thousand steps,
/// mostly because float's 0.999 is 1.3e-8 too large and 1 − β2^step cancels; computed in double
/// instead, fashion_mnist's epoch-1 loss differed from TF's tutorial by 5e-4 (docs/performance.md).
/// The powers are evaluated in double from the rounded betas and then rounded (the float power
/// correctly rounded, almost always), so that host and GPU get the same bits; TF's own float pow
/// differs from that by one unit in the last place at about a quarter of the steps.
template <class T>
MIRRORED_HOST_DEVICE inline T adam_step_size(double learning_rate, double beta_1, double beta_2, double step) {
  const T b1_power = static_cast<T>(std::pow(static_cast<double>(static_cast<T>(beta_1)), step));
  const T b2_power = static_cast<T>(std::pow(static_cast<double>(static_cast<T>(beta_2)), step));
  return static_cast<T>(learning_rate) * static_cast<T>(std::sqrt(T(1) - b2_power)) / (T(1) - b1_power);
}

namespace formulas {

// A formula is a type with
//   kind                  its OptimizerKind;
//   slots                 how many slots it keeps per variable (0 to kMaxOptimizerSlots);
//   slot_name(k)          the Keras name of slot k;
//   slot_initial(u, k)    the value slot k starts at;
//   Scalars<T>, scalars<T>(u, step)   the step's constants, in T;
//   update(s, w, g, slot...)          one element: w and the slots updated in place.

/// `w -= lr · g`.
struct Sgd {
  static constexpr OptimizerKind kind = OptimizerKind::sgd;
  static constexpr int slots = 0;
  static constexpr const char* slot_name(int) { return ""; }
  static constexpr double slot_initial(const OptimizerUpdate&, int) { return 0; }
  template <class T>
  struct Scalars {
    T lr;
  };
  template <class T>
  static MIRRORED_HOST_DEVICE Scalars<T> scalars(const OptimizerUpdate& u, int64_t) {
    return {static_cast<T>(u.learning_rate)};
  }
  template <class T>
  static MIRRORED_HOST_DEVICE void update(const Scalars<T>& s, T& w, T g) {
    w -= s.lr * g;
  }
};

/// `velocity = momentum · velocity − lr · g`; `w += velocity` (Nesterov:
/// `w += momentum · velocity − lr · g`).
template <bool kNesterov>
struct SgdMomentum {
  static constexpr OptimizerKind kind = kNesterov ? OptimizerKind::sgd_nesterov : OptimizerKind::sgd_momentum;
  static constexpr int slots = 1;
  static constexpr const char* slot_name(int) { return "momentum"; }
  static constexpr double slot_initial(const OptimizerUpdate&, int) { return 0; }
  template <class T>
  struct Scalars {
    T lr, momentum;
  };
  template <class T>
  static MIRRORED_HOST_DEVICE Scalars<T> scalars(const OptimizerUpdate& u, int64_t) {
    return {static_cast<T>(u.learning_rate), static_cast<T>(u.momentum)};
  }
  template <class T>
  static MIRRORED_HOST_DEVICE void update(const Scalars<T>& s, T& w, T g, T& velocity) {
    velocity = s.momentum * velocity - s.lr * g;
    if constexpr (kNesterov)
      w += s.momentum * velocity - s.lr * g;
    else
      w += velocity;
  }
};

/// `m += (g − m)(1 − β1)`, `v += (g² − v)(1 − β2)`, `w −= α · m / (√v + ε)` with
/// α = `adam_step_size`; AdamW first decays `w` by `w · weight_decay · lr` (the learning rate
/// before bias correction).
template <bool kDecay>
struct Adam {
  static constexpr OptimizerKind kind = kDecay ? OptimizerKind::adamw : OptimizerKind::adam;
  static constexpr int slots = 2;
  static constexpr const char* slot_name(int k) { return k == 0 ? "m" : "v"; }
  static constexpr double slot_initial(const OptimizerUpdate&, int) { return 0; }
  template <class T>
  struct Scalars {
    T alpha, one_minus_beta_1, one_minus_beta_2, epsilon, lr, weight_decay;
  };
  template <class T>
  static MIRRORED_HOST_DEVICE Scalars<T> scalars(const OptimizerUpdate& u, int64_t step) {
    return {adam_step_size<T>(u.learning_rate, u.beta_1, u.beta_2, static_cast<double>(step)),
            static_cast<T>(1 - u.beta_1),
            static_cast<T>(1 - u.beta_2),
            static_cast<T>(u.epsilon),
            static_cast<T>(u.learning_rate),
            static_cast<T>(u.weight_decay)};
  }
  template <class T>
  static MIRRORED_HOST_DEVICE void update(const Scalars<T>& s, T& w, T g, T& m, T& v) {
    using std::sqrt;
    if constexpr (kDecay) w = w - w * s.weight_decay * s.lr;
    m += (g - m) * s.one_minus_beta_1;
    v += (g * g - v) * s.one_minus_beta_2;
    w -= s.alpha * m / (sqrt(v) + s.epsilon);
  }
};

/// Keras 3's RMSprop: `velocity = ρ · velocity + (1 − ρ) · g²`; centered:
/// `average_gradient = ρ · average_gradient + (1 − ρ) · g` and
/// `denominator = velocity − average_gradient² + ε`, else `denominator = velocity + ε`;
/// `increment = lr · g / √denominator`; with momentum `momentum = μ · momentum + increment`,
/// `w −= momentum`, else `w −= increment`. Slots in Keras' order: velocity, momentum (with
/// momentum), average_gradient (centered).
template <bool kMomentum, bool kCentered>
struct RmsProp {
  static constexpr OptimizerKind kind =
      kCentered ? (kMomentum ? OptimizerKind::rmsprop_centered_momentum : OptimizerKind::rmsprop_centered)
                : (kMomentum ? OptimizerKind::rmsprop_momentum : OptimizerKind::rmsprop);
  static constexpr int slots = 1 + int{kMomentum} + int{kCentered};
  static constexpr const char* slot_name(int k) {
    return k == 0 ? "velocity" : (k == 1 && kMomentum) ? "momentum" : "average_gradient";
  }
  static constexpr double slot_initial(const OptimizerUpdate&, int) { return 0; }
  template <class T>
  struct Scalars {
    T lr, rho, one_minus_rho, epsilon, momentum;
  };
  template <class T>
  static MIRRORED_HOST_DEVICE Scalars<T> scalars(const OptimizerUpdate& u, int64_t) {
    return {static_cast<T>(u.learning_rate), static_cast<T>(u.rho), static_cast<T>(1 - u.rho),
            static_cast<T>(u.epsilon), static_cast<T>(u.momentum)};
  }
  template <class T, class... More>
  static MIRRORED_HOST_DEVICE void update(const Scalars<T>& s, T& w, T g, T& velocity, More&... more) {
    static_assert(sizeof...(More) == slots - 1, "RMSprop: one reference per slot");
    using std::sqrt;
    velocity = s.rho * velocity + s.one_minus_rho * (g * g);
    T denominator;
    if constexpr (kCentered) {
      T& average = last(more...);
      average = s.rho * average + s.one_minus_rho * g;
      denominator = velocity - average * average + s.epsilon;
    } else {
      denominator = velocity + s.epsilon;
    }
    const T increment = s.lr * g / sqrt(denominator);
    if constexpr (kMomentum) {
      T& m = first(more...);
      m = s.momentum * m + increment;
      w -= m;
    } else {
      w -= increment;
    }
  }

 private:
  template <class A, class... R>
  static MIRRORED_HOST_DEVICE A& first(A& a, R&...) {
    return a;
  }
  template <class A>
  static MIRRORED_HOST_DEVICE A& last(A& a) {
    return a;
  }
  template <class A, class B>
  static MIRRORED_HOST_DEVICE B& last(A&, B& b) {
    return b;
  }
};

/// Keras 3's Adagrad: `accumulator += g²`; `w −= lr · g / √(accumulator + ε)`; the accumulator
/// starts at `initial_accumulator_value`.
struct Adagrad {
  static constexpr OptimizerKind kind = OptimizerKind::adagrad;
  static constexpr int slots = 1;
  static constexpr const char* slot_name(int) { return "accumulator"; }
  static constexpr double slot_initial(const OptimizerUpdate& u, int) { return u.initial_accumulator_value; }
  template <class T>
  struct Scalars {
    T lr, epsilon;
  };
  template <class T>
  static MIRRORED_HOST_DEVICE Scalars<T> scalars(const OptimizerUpdate& u, int64_t) {
    return {static_cast<T>(u.learning_rate), static_cast<T>(u.epsilon)};
  }
  template <class T>
  static MIRRORED_HOST_DEVICE void update(const Scalars<T>& s, T& w, T g, T& accumulator) {
    using std::sqrt;
    accumulator += g * g;
    w -= s.lr * g / sqrt(accumulator + s.epsilon);
  }
};

}  // namespace formulas

template <class... F>
struct FormulaList {};

/// Every kind's formula.
using OptimizerFormulas =
    FormulaList<formulas::Sgd, formulas::SgdMomentum<false>, formulas::SgdMomentum<true>, formulas::Adam<false>,
                formulas::Adam<true>, formulas::RmsProp<false, false>, formulas::RmsProp<true, false>,
                formulas::RmsProp<false, true>, formulas::RmsProp<true, true>, formulas::Adagrad>;

template <class Fn, class... F>
constexpr bool visit_formula_in(OptimizerKind kind, Fn&& fn, FormulaList<F...>) {
  static_assert(((F::slots >= 0 && F::slots <= kMaxOptimizerSlots) && ...), "a formula keeps too many slots");
  return ((F::kind == kind ? (fn(F{}), true) : false) || ...);
}

/// Calls `fn(F{})` with the formula `F` of `kind`. Returns false (and calls nothing) for a value
/// that is no kind's.
template <class Fn>
constexpr bool visit_optimizer_formula(OptimizerKind kind, Fn&& fn) {
  return visit_formula_in(kind, fn, OptimizerFormulas{});
}

/// The slots `kind` keeps per variable (-1 for a value that is no kind's).
constexpr int optimizer_slot_count(OptimizerKind kind) {
  int n = -1;
  visit_optimizer_formula(kind, [&](auto f) { n = decltype(f)::slots; });
  return n;
}

/// The Keras name of slot `k` of `kind` ("" for none).
constexpr const char* optimizer_slot_name(OptimizerKind kind, int k) {
  const char* name = "";
  visit_optimizer_formula(kind, [&](auto f) {
    if (k >= 0 && k < decltype(f)::slots) name = decltype(f)::slot_name(k);
  });
  return name;
}

/// The value slot `k` of `u`'s kind starts at.
constexpr double optimizer_slot_initial(const OptimizerUpdate& u, int k) {
  double value = 0;
  visit_optimizer_formula(u.kind, [&](auto f) { value = decltype(f)::slot_initial(u, k); });
  return value;
}

}  // namespace mirrored::detail
