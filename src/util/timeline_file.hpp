#pragma once
// Private: the timeline's output file, in Chrome's "JSON Object Format":
// {"traceEvents":[ ...events... ],"displayTimeUnit":"ms"}. Events are formatted into a buffer and
// written in large pieces; the writer thread and `stop` own it (under the recorder's lock), never the
// threads that record events.
#include <cstdint>
#include <string>
#include <string_view>

#include "util/timeline.hpp"

#include "util/json.hpp"

namespace mirrored::detail::timeline {

using json::append_json_string;  // util/json.hpp: file names may hold any bytes

class TimelineFile {
 public:
  /// Opens `path` for writing as a hostile file system demands: never through a symbolic link
  /// (O_NOFOLLOW), never blocking in open on a FIFO (O_NONBLOCK), not inherited by child processes
  /// (O_CLOEXEC), and only a regular file, which is then truncated (a device or FIFO is refused
  /// before anything is written to it). `pid` is the process id of every event.
  /// \throws the types of `throw_file_error` (the message names `path` and the errno's text);
  /// InvalidArgumentError for a symbolic link or a file that is not a regular file.
  TimelineFile(std::string path, int pid);
  ~TimelineFile();
  TimelineFile(const TimelineFile&) = delete;
  TimelineFile& operator=(const TimelineFile&) = delete;

  const std::string& path() const noexcept { return path_; }

  /// One complete event ("ph":"X") of thread `tid` from `begin_ns` to `end_ns` (nanoseconds since
  /// the timeline's origin; `e`'s own times are ticks), written in microseconds with nanosecond digits.
  void event(const Record& e, int tid, std::int64_t begin_ns, std::int64_t end_ns);
  /// Metadata events naming the process or a thread.
  void process_name(const std::string& name);
  void thread_name(int tid, const std::string& name);
  /// Writes what is buffered (a failure is remembered: see `finish`).
  void flush() noexcept;
  /// Writes the rest and the end of the JSON, and closes the file. \throws the types of
  /// `throw_file_error` when any write of this file failed (the first failure's errno).
  void finish();

 private:
  void begin_event();
  void write_out() noexcept;

  std::string path_;
  int pid_;
  int fd_ = -1;
  int error_ = 0;  // errno of the first failed write; nothing is written after it
  bool first_ = true;
  std::string buffer_;
};

}  // namespace mirrored::detail::timeline
