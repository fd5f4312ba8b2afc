#pragma once
// Private: the short busy-waits used before blocking. A few pause instructions catch a peer that is
// about to arrive; yielding next lets it run when threads outnumber cores. Blocking (a futex or a
// condition variable) costs a sleep and a wake-up, tens of microseconds on a busy VM.
#include <chrono>
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

/// Spins until `done()` or the budget of rounds is spent; returns whether `done()` became true.
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

/// Spins (in `spin_until` rounds) until `done()` or `budget` has passed; returns `done()`.
template <class Done>
bool spin_for(Done&& done, std::chrono::microseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  do {
    if (spin_until(done, 256, 1)) return true;
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

/// The pauses of a poll that must also meet a deadline (a device query, an NCCL state): a busy poll
/// at first, then yields, then short sleeps, so a quick completion is seen at once and a long one
/// costs little CPU.
class Backoff {
 public:
  void pause() {
    ++rounds_;
    if (rounds_ < 64) return;
    if (rounds_ < 256) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rounds_ < 2048 ? 20 : 500));
  }

 private:
  int rounds_ = 0;
};

}  // namespace mirrored::detail
