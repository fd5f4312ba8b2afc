// The host's fused optimizer update. This file is compiled with -fno-math-errno so that the
// square roots of Adam vectorise: sqrt is correctly rounded either way, only errno is not set.
#include "device/host/host_optimizer.hpp"

#include <cmath>

#include "mirrored/detail/adam_step_size.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {
namespace {

// The scalars of one step, converted to T as the per-variable update converts them.
template <class T>
struct Scalars {
  T lr, momentum, adam_lr, one_minus_beta_1, one_minus_beta_2, epsilon, weight_decay;
};

template <class T>
Scalars<T> scalars(const OptimizerUpdate& u, int64_t step) {
  Scalars<T> s{};
  s.lr = static_cast<T>(u.learning_rate);
  s.momentum = static_cast<T>(u.momentum);
  if (u.kind == OptimizerKind::adam || u.kind == OptimizerKind::adamw) {
    s.adam_lr = static_cast<T>(adam_step_size(u.learning_rate, u.beta_1, u.beta_2, static_cast<double>(step)));
    s.one_minus_beta_1 = static_cast<T>(1 - u.beta_1);
    s.one_minus_beta_2 = static_cast<T>(1 - u.beta_2);
    s.epsilon = static_cast<T>(u.epsilon);
    s.weight_decay = static_cast<T>(u.weight_decay);
  }
  return s;
}

// One loop per kind, without branches inside, and restrict-qualified (segments do not overlap),
// so that each vectorises.
template <class T>
void update(OptimizerKind kind, const Scalars<T>& s, const UpdateSegment& seg) {
  T* __restrict w = static_cast<T*>(seg.param);
  const T* __restrict g = static_cast<const T*>(seg.grad);
  const int64_t n = seg.count;
  const T lr = s.lr, m = s.momentum;
  switch (kind) {
    case OptimizerKind::sgd:
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
      return;
    case OptimizerKind::sgd_momentum: {
      T* __restrict v = static_cast<T*>(seg.slot[0]);
      for (int64_t i = 0; i < n; ++i) {
        v[i] = m * v[i] - lr * g[i];
        w[i] += v[i];
      }
      return;
    }
    case OptimizerKind::sgd_nesterov: {
      T* __restrict v = static_cast<T*>(seg.slot[0]);
      for (int64_t i = 0; i < n; ++i) {
        v[i] = m * v[i] - lr * g[i];
        w[i] += m * v[i] - lr * g[i];
      }
      return;
    }
    case OptimizerKind::adam: {
      T* __restrict mo = static_cast<T*>(seg.slot[0]);
      T* __restrict ve = static_cast<T*>(seg.slot[1]);
      const T alpha = s.adam_lr, b1 = s.one_minus_beta_1, b2 = s.one_minus_beta_2, eps = s.epsilon;
      for (int64_t i = 0; i < n; ++i) {
        mo[i] += (g[i] - mo[i]) * b1;
        ve[i] += (g[i] * g[i] - ve[i]) * b2;
        w[i] -= alpha * mo[i] / (std::sqrt(ve[i]) + eps);
      }
      return;
    }
    case OptimizerKind::adamw: {
      T* __restrict mo = static_cast<T*>(seg.slot[0]);
      T* __restrict ve = static_cast<T*>(seg.slot[1]);
      const T alpha = s.adam_lr, b1 = s.one_minus_beta_1, b2 = s.one_minus_beta_2, eps = s.epsilon;
      const T wd = s.weight_decay;
      for (int64_t i = 0; i < n; ++i) {
        // Keras' AdamW decays first, with the learning rate before bias correction.
        const T decayed = w[i] - w[i] * wd * lr;
        mo[i] += (g[i] - mo[i]) * b1;
        ve[i] += (g[i] * g[i] - ve[i]) * b2;
        w[i] = decayed - alpha * mo[i] / (std::sqrt(ve[i]) + eps);
      }
      return;
    }
  }
}

}  // namespace

void check_optimizer_arguments(const char* device, DType dtype, const OptimizerUpdate& u, int num_segments,
                               const int64_t* step_in, const int64_t* step_out) {
  MIRRORED_ENFORCE(dtype == DType::float32 || dtype == DType::float64, InvalidArgumentError, "apply_optimizer on ",
                   device, ": dtype ", dtype_name(dtype), " is not float32 or float64");
  MIRRORED_ENFORCE(num_segments >= 0 && num_segments <= kMaxUpdateSegments, InvalidArgumentError, "apply_optimizer on ",
                   device, ": ", num_segments, " segments, expected 0 to ", kMaxUpdateSegments);
  MIRRORED_ENFORCE(step_in != nullptr, InvalidArgumentError, "apply_optimizer on ", device, ": no step counter");
  MIRRORED_ENFORCE(step_out != step_in, InvalidArgumentError, "apply_optimizer on ", device,
                   ": step_out must not be step_in (the new step goes to a buffer of its own)");
  const int kind = static_cast<int>(u.kind);
  MIRRORED_ENFORCE(kind >= 0 && kind <= static_cast<int>(OptimizerKind::adamw), InvalidArgumentError,
                   "apply_optimizer on ", device, ": unknown optimizer kind ", kind);
}

void host_apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                          const int64_t* step_in, int64_t* step_out) {
  check_optimizer_arguments("CPU:0", dtype, u, num_segments, step_in, step_out);
  const int64_t step = *step_in + 1;
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const Scalars<T> s = scalars<T>(u, step);
    for (int k = 0; k < num_segments; ++k) update<T>(u.kind, s, segments[k]);
  };
  if (dtype == DType::float32) {
    run(float{});
  } else {
    run(double{});
  }
  if (step_out) *step_out = step;
}

}  // namespace mirrored::detail
