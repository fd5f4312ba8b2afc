#pragma once
/// \file
/// Minimal leveled logging to stderr, filtered by `MIRRORED_LOG_LEVEL` (DEBUG, INFO, WARN, ERROR,
/// OFF; default WARN).

#include <string>

#include "mirrored/errors.hpp"

namespace mirrored::detail {

// Lower case: DEBUG and ERROR are macros in common headers and build flags.
enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

/// True when messages of `level` are printed.
bool log_enabled(LogLevel level);
/// Prints `[mirrored LEVEL] message` to stderr (one write, safe from any thread).
void log_message(LogLevel level, const std::string& message);

/// A positive number (seconds, megabytes, …) from environment variable `name`, else `fallback` (a malformed, negative
/// or infinite value is reported with a warning).
double env_positive(const char* name, double fallback);

}  // namespace mirrored::detail

/// Logs the streamable parts at `level` when that level is enabled.
#define MIRRORED_LOG(level, ...)                                                                                      \
  do {                                                                                                                \
    if (::mirrored::detail::log_enabled(::mirrored::detail::LogLevel::level))                                         \
      ::mirrored::detail::log_message(::mirrored::detail::LogLevel::level, ::mirrored::detail::str_cat(__VA_ARGS__)); \
  } while (0)
