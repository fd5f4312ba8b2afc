#pragma once
// Private: the library's cheap clock for timestamps taken on hot paths (the timeline's events, the
// flight recorder's entries). Ticks are read on the hot path and converted to steady-clock
// nanoseconds later, by interpolating between (ticks, nanoseconds) anchors.
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace mirrored::detail::tick_clock {

/// Steady-clock nanoseconds.
std::int64_t now_ns() noexcept;

/// Whether the time-stamp counter is the clock: on x86-64 where the kernel keeps time with it
/// itself (it then runs at a constant rate and agrees across cores), unless
/// MIRRORED_TIMELINE_CLOCK=steady says otherwise. Decided once per process. A counter read costs
/// about half a steady-clock read on a VM (16 against 28 ns here).
bool tsc_is_the_clock() noexcept;

/// Ticks: the time-stamp counter when `tsc`, else `now_ns()`.
inline std::int64_t now(bool tsc) noexcept {
#if defined(__x86_64__)
  if (tsc) return static_cast<std::int64_t>(__rdtsc());
#endif
  return now_ns();
}

/// A (ticks, steady clock) pair.
struct Anchor {
  std::int64_t ticks;
  std::int64_t ns;
};

/// Reads both clocks back to back; retried when something (preemption) came between the reads.
Anchor take_anchor(bool tsc) noexcept;

/// The steady-clock nanoseconds of tick `t` on the line through `a` and `b` (b.ticks > a.ticks).
inline std::int64_t to_ns(std::int64_t t, const Anchor& a, const Anchor& b) noexcept {
  const double ns_per_tick = static_cast<double>(b.ns - a.ns) / static_cast<double>(b.ticks - a.ticks);
  return a.ns + std::llround(static_cast<double>(t - a.ticks) * ns_per_tick);
}

}  // namespace mirrored::detail::tick_clock
