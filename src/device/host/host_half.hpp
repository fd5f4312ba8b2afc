#pragma once
// Private: the host backend's float16 kernels on x86-64's F16C instructions, eight elements at a
// time: float <-> float16 conversions and sums of float16 buffers. Without them a conversion costs
// about a nanosecond per element, which made float16 the slowest part of anything that converts
// (the cross-worker compression converts every element of a gradient twice).
//
// No second rounding: the instructions round to nearest even, overflow to infinity, produce
// subnormals and keep NaN payloads exactly as half.hpp's conversions do, whatever MXCSR says
// (tests/tensor/test_host_half.cpp checks every float16 and a dense sample of floats). The one
// difference, that widening quiets a signaling NaN, is undone here.

#include <cstdint>

#include "mirrored/half.hpp"

namespace mirrored::detail {

/// True when this CPU has F16C and AVX2 (asked once); the functions below need it.
bool host_has_f16c() noexcept;

/// `out[i] = float16(in[i])`.
void f16c_narrow(const float* in, float16* out, int64_t count) noexcept;
/// `out[i] = float(in[i])`.
void f16c_widen(const float16* in, float* out, int64_t count) noexcept;
/// `out[i]` = the float sum of `inputs[0][i] + inputs[1][i] + …` in that order, divided by
/// `mean_divisor` when it is > 0, rounded once: the host backend's sum_n(_mean) of float16.
void f16c_sum(const float16* const* inputs, int num_inputs, float16* out, int64_t count, int64_t mean_divisor) noexcept;

}  // namespace mirrored::detail
