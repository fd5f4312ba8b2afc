#pragma once
// Private: leveled logging (the public side is <mirrored/logging.hpp>: the sink and the threshold),
// and numbers read from environment variables, whose bad values are reported once each.

#include <string>

#include "mirrored/errors.hpp"
#include "mirrored/logging.hpp"

namespace mirrored::detail {

using mirrored::LogLevel;

/// True when lines of `level` are produced (cheap: one relaxed atomic load).
bool log_enabled(LogLevel level) noexcept;
/// Hands `[mirrored LEVEL] message` to the sink, or writes it to stderr in one write.
void log_message(LogLevel level, const std::string& message);

/// A positive number (seconds, megabytes, …) from environment variable `name`, else `fallback`. A
/// malformed, non-positive or infinite value is warned about (once per variable and value).
double env_positive(const char* name, double fallback);
/// Like `env_positive`, but 0 is a valid value (e.g. a cache size: 0 disables the cache).
double env_non_negative(const char* name, double fallback);
/// MIRRORED_STALL_WARN_S (default 60): how long a wait goes on before it warns, within one process
/// (the replicas' rendezvous) and across workers (a collective, the start-up).
double stall_warn_seconds();

}  // namespace mirrored::detail

/// Logs the streamable parts at `level` when that level is enabled.
#define MIRRORED_LOG(level, ...)                                                                              \
  do {                                                                                                        \
    if (::mirrored::detail::log_enabled(::mirrored::LogLevel::level))                                         \
      ::mirrored::detail::log_message(::mirrored::LogLevel::level, ::mirrored::detail::str_cat(__VA_ARGS__)); \
  } while (0)
