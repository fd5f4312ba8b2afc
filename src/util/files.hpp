#pragma once
// Private: opening files for reading as a hostile file system demands. A FIFO named like a data
// file must not block the caller in open(2), a directory or a device is not data, and the errno
// of a failure decides the error type, so that "permission denied" is not reported as "no such
// file".
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace mirrored::detail {

/// Which kind of file `mode` (st_mode) describes, for messages: "a directory", "a FIFO", …
const char* file_kind(mode_t mode) noexcept;

/// A file descriptor opened by `open_regular_file`, closed on destruction.
class ReadableFile {
 public:
  ReadableFile() = default;
  ReadableFile(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  ~ReadableFile();
  ReadableFile(ReadableFile&& other) noexcept : fd_(other.release()), size_(other.size_) {}
  ReadableFile& operator=(ReadableFile&& other) noexcept;
  ReadableFile(const ReadableFile&) = delete;
  ReadableFile& operator=(const ReadableFile&) = delete;

  int fd() const noexcept { return fd_; }
  /// The size when it was opened (fstat).
  std::uint64_t size() const noexcept { return size_; }
  /// Gives up ownership of the descriptor.
  int release() noexcept;

 private:
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// Opens `path` read-only (O_CLOEXEC). The open itself never blocks (O_NONBLOCK, cleared again once
/// the file is known to be a regular file), and anything but a regular file is refused.
/// Messages start with `prefix` (e.g. "text_line_dataset: ") and name the file and the reason.
/// \throws NotFoundError (ENOENT: "no such file or directory"), PermissionDeniedError (EACCES,
/// EPERM) with the errno text, InvalidArgumentError for a directory ("is a directory"), a FIFO,
/// socket or device ("is not a regular file (it is a FIFO)"), and the errnos `throw_file_error`
/// maps to it; UnavailableError for any other errno.
ReadableFile open_regular_file(const std::string& path, const std::string& prefix);

/// Throws the error type that `err` (an errno of an operation on `path`) calls for, with the
/// message `<prefix><what> '<path>' failed: <strerror>`: NotFoundError (ENOENT),
/// PermissionDeniedError (EACCES, EPERM), InvalidArgumentError (EISDIR, ENOTDIR, ELOOP,
/// ENAMETOOLONG, EINVAL), FailedPreconditionError (EROFS, ENOSPC, EDQUOT, EFBIG: the file system
/// cannot take it) or UnavailableError (anything else, e.g. EIO).
[[noreturn]] void throw_file_error(const std::string& prefix, const char* what, const std::string& path, int err);

}  // namespace mirrored::detail
