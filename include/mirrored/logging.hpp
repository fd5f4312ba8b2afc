#pragma once
/// \file
/// Where the library's log lines go. By default lines of `MIRRORED_LOG_LEVEL` (DEBUG, INFO, WARN,
/// ERROR or OFF; default WARN) and above are written to stderr as `[mirrored LEVEL] message`; a
/// program that routes its logs itself installs a sink.

#include <functional>
#include <string_view>

namespace mirrored {

/// Severity of a log line, lowest first. (Lower case: DEBUG and ERROR are macros in common
/// headers and build flags.)
enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

/// "DEBUG", "INFO", "WARN", "ERROR", "OFF".
const char* log_level_name(LogLevel level) noexcept;

/// Receives each log line at or above the threshold, from whichever thread logs it (replica
/// threads, the input pipeline's threads), one call per line. It must not throw.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

/// Routes the library's log lines to `sink` instead of stderr; an empty sink restores stderr.
/// Thread-safe; a line being logged while the sink is replaced goes to the old or the new one.
void set_log_sink(LogSink sink);

/// Sets the threshold (overrides `MIRRORED_LOG_LEVEL`): lines below `level` are not produced.
void set_log_level(LogLevel level);

}  // namespace mirrored
