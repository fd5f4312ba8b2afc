#pragma once
/// \file
/// `Deadline`: the one point in time by which a call of the library must be done. It is made once,
/// where the call enters the library (from `CommunicationOptions::timeout_seconds` or the
/// strategy's collective timeout), and every layer below waits against the same point: the
/// replicas' rendezvous, the backends (`CollectiveStep::deadline()`), the cross-worker stage, the
/// transports and the device. No layer turns it back into a fresh timeout, so the whole call is
/// bounded by its timeout (plus the documented `kCollectiveGraceSeconds` for learning why).

#include <chrono>

namespace mirrored {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// `seconds` from now. Huge or infinite timeouts are capped (~32 years) so that the addition
  /// cannot overflow the clock into the past; negative ones mean "now".
  static Deadline after(double seconds) noexcept {
    // As std::clamp(seconds, 0.0, kMaxSeconds), without <algorithm> in every user's translation unit.
    const double s = seconds < 0.0 ? 0.0 : (kMaxSeconds < seconds ? kMaxSeconds : seconds);
    const Clock::time_point now = Clock::now();
    return Deadline(now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)), s, now);
  }

  /// The point in time, for `wait_until` and friends.
  Clock::time_point time_point() const noexcept { return at_; }
  /// Seconds left (0 once past).
  double seconds_left() const noexcept {
    const double left = std::chrono::duration<double>(at_ - Clock::now()).count();
    return 0.0 < left ? left : 0.0;  // std::max(0.0, left)
  }
  bool expired() const noexcept { return Clock::now() >= at_; }
  /// The timeout this deadline was made from, for messages ("within 2 s"); never for waiting.
  double timeout_seconds() const noexcept { return timeout_s_; }
  /// When it was made: when the call entered the library (the flight recorder's issue time, which
  /// thus costs no clock read of its own).
  Clock::time_point made() const noexcept { return made_; }
  /// The same deadline `seconds` later: for a wait that must outlast another party's wait on this
  /// deadline (the one that reports why), never to re-arm a timeout.
  Deadline extended(double seconds) const noexcept {
    return Deadline(at_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)),
                    timeout_s_, made_);
  }

 private:
  static constexpr double kMaxSeconds = 1e9;
  Deadline(Clock::time_point at, double timeout_s, Clock::time_point made) noexcept
      : at_(at), timeout_s_(timeout_s), made_(made) {}
  Clock::time_point at_;
  double timeout_s_;
  Clock::time_point made_;
};

/// How much later than its deadline a collective may surface its error: the time a replica or
/// worker that timed out takes to learn and publish the cause (which replica or worker never
/// arrived) and to release the others. A collective whose peer never arrives fails within its
/// timeout plus this.
inline constexpr double kCollectiveGraceSeconds = 1.0;

}  // namespace mirrored
