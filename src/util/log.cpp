#include "util/log.hpp"

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace mirrored {
namespace {

LogLevel parse_level() {
  const char* env = std::getenv("MIRRORED_LOG_LEVEL");
  if (!env || !*env) return LogLevel::warn;
  std::string v(env);
  for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "DEBUG") return LogLevel::debug;
  if (v == "INFO") return LogLevel::info;
  if (v == "WARN" || v == "WARNING") return LogLevel::warn;
  if (v == "ERROR") return LogLevel::error;
  if (v == "OFF" || v == "NONE") return LogLevel::off;
  std::fprintf(
      stderr, "[mirrored WARN] MIRRORED_LOG_LEVEL='%s' is not one of DEBUG, INFO, WARN, ERROR, OFF; using WARN\n", env);
  return LogLevel::warn;
}

std::atomic<int>& threshold() {
  static std::atomic<int> level{static_cast<int>(parse_level())};
  return level;
}

struct SinkSlot {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;  // null: stderr
};
SinkSlot& sink_slot() {
  static SinkSlot* slot = new SinkSlot;  // outlives static objects that log while they are destroyed
  return *slot;
}

}  // namespace

const char* log_level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::debug: return "DEBUG";
    case LogLevel::info: return "INFO";
    case LogLevel::warn: return "WARN";
    case LogLevel::error: return "ERROR";
    case LogLevel::off: break;
  }
  return "OFF";
}

void set_log_sink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  auto& slot = sink_slot();
  std::lock_guard lock(slot.mu);
  slot.sink = std::move(next);
}

void set_log_level(LogLevel level) { threshold().store(static_cast<int>(level), std::memory_order_relaxed); }

namespace detail {

bool log_enabled(LogLevel level) noexcept {
  return level != LogLevel::off && static_cast<int>(level) >= threshold().load(std::memory_order_relaxed);
}

void log_message(LogLevel level, const std::string& message) {
  std::shared_ptr<const LogSink> sink;
  {
    auto& slot = sink_slot();
    std::lock_guard lock(slot.mu);
    sink = slot.sink;
  }
  if (sink) {
    (*sink)(level, message);  // outside the lock: a sink may be slow, or replace itself
    return;
  }
  const std::string line = std::string("[mirrored ") + log_level_name(level) + "] " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

namespace {

// A bad value is reported once per variable and value: strategies and caches read the same
// variables again and again.
bool first_report(const char* name, const char* value) {
  static std::mutex mu;
  static std::set<std::pair<std::string, std::string>> reported;
  std::lock_guard lock(mu);
  return reported.emplace(name, value).second;
}

double env_number(const char* name, double fallback, bool zero_allowed) {
  const char* env = std::getenv(name);
  if (!env || !*env) return fallback;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  const bool in_range = zero_allowed ? v >= 0 : v > 0;
  if (end == env || *end != '\0' || !in_range || !std::isfinite(v)) {
    if (first_report(name, env)) {
      MIRRORED_LOG(warn, name, "='", env, "' is not a ", zero_allowed ? "non-negative" : "positive", " number; using ",
                   fallback);
    }
    return fallback;
  }
  return v;
}

}  // namespace

double env_positive(const char* name, double fallback) { return env_number(name, fallback, false); }
double env_non_negative(const char* name, double fallback) { return env_number(name, fallback, true); }
double stall_warn_seconds() { return env_positive("MIRRORED_STALL_WARN_S", 60.0); }

}  // namespace detail
}  // namespace mirrored
