#include "util/log.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace mirrored::detail {
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

LogLevel threshold() {
  static const LogLevel level = parse_level();
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug: return "DEBUG";
    case LogLevel::info: return "INFO";
    case LogLevel::warn: return "WARN";
    case LogLevel::error: return "ERROR";
    case LogLevel::off: break;
  }
  return "OFF";
}

}  // namespace

bool log_enabled(LogLevel level) { return level != LogLevel::off && level >= threshold(); }

void log_message(LogLevel level, const std::string& message) {
  const std::string line = std::string("[mirrored ") + level_name(level) + "] " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

double env_positive(const char* name, double fallback) {
  const char* env = std::getenv(name);
  if (!env || !*env) return fallback;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(v > 0) || !std::isfinite(v)) {
    MIRRORED_LOG(warn, name, "='", env, "' is not a positive number; using ", fallback);
    return fallback;
  }
  return v;
}

}  // namespace mirrored::detail
