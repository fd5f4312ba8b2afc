// The tick clock (util/tick_clock.hpp).
#include "util/tick_clock.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace mirrored::detail::tick_clock {

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool tsc_is_the_clock() noexcept {
#if defined(__x86_64__)
  static const bool tsc = [] {
    if (const char* env = std::getenv("MIRRORED_TIMELINE_CLOCK"); env && std::string(env) == "steady") return false;
    const int fd =
        ::open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    char buf[16] = {};
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    return n >= 3 && std::string(buf, static_cast<std::size_t>(n)).rfind("tsc", 0) == 0 && (n == 3 || buf[3] == '\n');
  }();
  return tsc;
#else
  return false;
#endif
}

Anchor take_anchor(bool tsc) noexcept {
  Anchor best{0, 0};
  std::int64_t best_gap = -1;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::int64_t before = now_ns();
    const std::int64_t ticks = now(tsc);
    const std::int64_t after = now_ns();
    if (best_gap < 0 || after - before < best_gap) {
      best = {ticks, before + (after - before) / 2};
      best_gap = after - before;
    }
    if (best_gap < 1000) break;
  }
  return best;
}

}  // namespace mirrored::detail::tick_clock
