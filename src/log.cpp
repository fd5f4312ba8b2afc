#include "mirrored/detail/log.hpp"

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
  if (!env || !*env) return LogLevel::WARN;
  std::string v(env);
  for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "DEBUG") return LogLevel::DEBUG;
  if (v == "INFO") return LogLevel::INFO;
  if (v == "WARN" || v == "WARNING") return LogLevel::WARN;
  if (v == "ERROR") return LogLevel::ERROR;
  if (v == "OFF" || v == "NONE") return LogLevel::OFF;
  std::fprintf(stderr, "[mirrored WARN] MIRRORED_LOG_LEVEL='%s' is not one of DEBUG, INFO, WARN, ERROR, OFF; using WARN\n", env);
  return LogLevel::WARN;
}

LogLevel threshold() {
  static const LogLevel level = parse_level();
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::DEBUG: return "DEBUG";
    case LogLevel::INFO: return "INFO";
    case LogLevel::WARN: return "WARN";
    case LogLevel::ERROR: return "ERROR";
    case LogLevel::OFF: break;
  }
  return "OFF";
}

}  // namespace

bool log_enabled(LogLevel level) { return level != LogLevel::OFF && level >= threshold(); }

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
    MIRRORED_LOG(WARN, name, "='", env, "' is not a positive number; using ", fallback);
    return fallback;
  }
  return v;
}

}  // namespace mirrored::detail
