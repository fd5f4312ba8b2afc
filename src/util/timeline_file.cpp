#include "util/timeline_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

#include "mirrored/errors.hpp"
#include "util/files.hpp"
#include "util/log.hpp"
#include "util/utf8.hpp"

namespace mirrored::detail::timeline {
namespace {

constexpr const char* kPrefix = "timeline: ";
// Formatted events are written once this many bytes are buffered (and by every flush).
constexpr std::size_t kWriteBytes = 256 * 1024;

// std::to_chars, not snprintf: the writer formats every event, beside the replicas' threads.
void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Nanoseconds as microseconds with three decimals, exactly (no floating point): 1234567 → 1234.567.
void append_us(std::string& out, std::int64_t ns) {
  if (ns < 0) ns = 0;
  append_int(out, ns / 1000);
  const auto frac = static_cast<int>(ns % 1000);
  const char digits[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                          static_cast<char>('0' + frac % 10)};
  out.append(digits, sizeof digits);
}

}  // namespace

TimelineFile::TimelineFile(std::string path, int pid) : path_(std::move(path)), pid_(pid) {
  int fd = -1;
  for (;;) {
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd >= 0) break;
    const int err = errno;
    if (err == EINTR) continue;
    MIRRORED_ENFORCE(err != ELOOP, InvalidArgumentError, kPrefix, "'", path_,
                     "' is a symbolic link; the timeline is not written through one (O_NOFOLLOW)");
    // A FIFO (or socket) nobody reads: opening it for writing without blocking fails with ENXIO.
    MIRRORED_ENFORCE(err != ENXIO, InvalidArgumentError, kPrefix, "'", path_,
                     "' is not a regular file (a FIFO or socket without a reader)");
    throw_file_error(kPrefix, "opening", path_, err);
  }
  fd_ = fd;
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(std::exchange(fd_, -1));
    throw_file_error(kPrefix, "stat of", path_, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(std::exchange(fd_, -1));
    throw InvalidArgumentError(
        str_cat(kPrefix, "'", path_, "' is not a regular file (it is ", file_kind(st.st_mode), ")"));
  }
  // Truncated only now that it is known to be a regular file; writes to a regular file never block, so
  // O_NONBLOCK can stay.
  if (::ftruncate(fd_, 0) != 0) {
    const int err = errno;
    ::close(std::exchange(fd_, -1));
    throw_file_error(kPrefix, "truncating", path_, err);
  }
  buffer_ = "{\"traceEvents\":[";
}

TimelineFile::~TimelineFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TimelineFile::begin_event() {
  if (!first_) buffer_ += ",\n";
  first_ = false;
}

void TimelineFile::event(const Record& e, int tid, std::int64_t begin_ns, std::int64_t end_ns) {
  if (error_) return;
  begin_event();
  buffer_ += "{\"name\":";
  append_json_string(buffer_, e.name);
  buffer_ += ",\"cat\":";
  append_json_string(buffer_, e.category);
  buffer_ += ",\"ph\":\"X\",\"pid\":";
  append_int(buffer_, pid_);
  buffer_ += ",\"tid\":";
  append_int(buffer_, tid);
  buffer_ += ",\"ts\":";
  append_us(buffer_, begin_ns);
  buffer_ += ",\"dur\":";
  append_us(buffer_, end_ns - begin_ns);
  if (e.num_args > 0 || e.text) {
    buffer_ += ",\"args\":{";
    for (int i = 0; i < e.num_args; ++i) {
      if (i) buffer_ += ',';
      append_json_string(buffer_, e.args[i].key);
      buffer_ += ':';
      if (e.args[i].str)
        append_json_string(buffer_, e.args[i].str);
      else
        append_int(buffer_, e.args[i].num);
    }
    if (e.text) {
      if (e.num_args > 0) buffer_ += ',';
      buffer_ += "\"path\":";
      append_json_string(buffer_, *e.text);
    }
    buffer_ += '}';
  }
  buffer_ += '}';
  if (buffer_.size() >= kWriteBytes) write_out();
}

void TimelineFile::process_name(const std::string& name) {
  if (error_) return;
  begin_event();
  buffer_ += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
  append_int(buffer_, pid_);
  buffer_ += ",\"tid\":0,\"args\":{\"name\":";
  append_json_string(buffer_, name);
  buffer_ += "}}";
}

void TimelineFile::thread_name(int tid, const std::string& name) {
  if (error_) return;
  begin_event();
  buffer_ += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":";
  append_int(buffer_, pid_);
  buffer_ += ",\"tid\":";
  append_int(buffer_, tid);
  buffer_ += ",\"args\":{\"name\":";
  append_json_string(buffer_, name);
  buffer_ += "}}";
}

void TimelineFile::write_out() noexcept {
  std::size_t done = 0;
  while (!error_ && done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      error_ = n < 0 ? errno : EIO;
      // Said once, when it happens (a timeline written at exit has nobody to throw to).
      try {
        MIRRORED_LOG(warn, kPrefix, "writing '", path_, "' failed: ", std::strerror(error_),
                     "; the rest of the timeline is dropped");
      } catch (...) {
      }
    }
  }
  buffer_.clear();
}

void TimelineFile::flush() noexcept {
  if (!buffer_.empty()) write_out();
}

void TimelineFile::finish() {
  if (!error_) buffer_ += "\n],\"displayTimeUnit\":\"ms\"}\n";
  flush();
  const int fd = std::exchange(fd_, -1);
  if (fd >= 0 && ::close(fd) != 0 && !error_) error_ = errno;
  if (error_) throw_file_error(kPrefix, "writing", path_, error_);
}

}  // namespace mirrored::detail::timeline
