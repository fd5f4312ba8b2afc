// The host's fused optimizer update: each kind's formula (mirrored/detail/optimizer_formulas.hpp)
// applied element by element. This file is compiled with -fno-math-errno so that the square roots
// vectorise: sqrt is correctly rounded either way, only errno is not set.
#include "device/host/host_optimizer.hpp"

#include <cmath>
#include <utility>

#include "mirrored/detail/optimizer_formulas.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {
namespace {

// One loop per kind, without branches inside, and restrict-qualified (segments and slots do not
// overlap), so that each vectorises.
template <class F, class T, class... Slot>
void update_elements(const typename F::template Scalars<T>& s, T* __restrict w, const T* __restrict g, int64_t n,
                     Slot* __restrict... slot) {
  for (int64_t i = 0; i < n; ++i) F::update(s, w[i], g[i], slot[i]...);
}

template <class F, class T, std::size_t... K>
void update_segment(const typename F::template Scalars<T>& s, const UpdateSegment& seg, std::index_sequence<K...>) {
  update_elements<F, T>(s, static_cast<T*>(seg.param), static_cast<const T*>(seg.grad), seg.count,
                        static_cast<T*>(seg.slot[K])...);
}

template <class T>
void update_segments(const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments, int64_t step) {
  visit_optimizer_formula(u.kind, [&](auto formula) {
    using F = decltype(formula);
    const auto s = F::template scalars<T>(u, step);
    for (int k = 0; k < num_segments; ++k)
      update_segment<F, T>(s, segments[k], std::make_index_sequence<static_cast<std::size_t>(F::slots)>{});
  });
}

void update_on_host(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                    int64_t step) {
  if (dtype == DType::float32) {
    update_segments<float>(u, segments, num_segments, step);
  } else {
    update_segments<double>(u, segments, num_segments, step);
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
  MIRRORED_ENFORCE(optimizer_slot_count(u.kind) >= 0, InvalidArgumentError, "apply_optimizer on ", device,
                   ": unknown optimizer kind ", static_cast<int>(u.kind));
}

void host_apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                          const int64_t* step_in, int64_t* step_out) {
  check_optimizer_arguments("CPU:0", dtype, u, num_segments, step_in, step_out);
  const int64_t step = *step_in + 1;
  update_on_host(dtype, u, segments, num_segments, step);
  if (step_out) *step_out = step;
}

void apply_formula_on_host(DType dtype, const OptimizerUpdate& u, const UpdateSegment& segment, int64_t step) {
  MIRRORED_ENFORCE(dtype == DType::float32 || dtype == DType::float64, InvalidArgumentError, "apply_gradients: dtype ",
                   dtype_name(dtype), " is not float32 or float64");
  MIRRORED_ENFORCE(optimizer_slot_count(u.kind) >= 0, InvalidArgumentError, "apply_gradients: unknown optimizer kind ",
                   static_cast<int>(u.kind));
  update_on_host(dtype, u, &segment, 1, step);
}

}  // namespace mirrored::detail
