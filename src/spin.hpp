#pragma once
// Private: the short busy-wait used before blocking. A few pause instructions catch peers that
// are about to arrive; yielding next lets them run when replicas outnumber cores.
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mirrored::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

/// Spins until `done()` or the budget is spent; returns whether `done()` became true.
template <class Done>
bool spin_until(Done&& done, int pause_rounds = 128, int yield_rounds = 16) noexcept {
  for (int i = 0; i < pause_rounds; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  for (int i = 0; i < yield_rounds; ++i) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

}  // namespace mirrored::detail
