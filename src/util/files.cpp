// Opening files for reading without blocking on FIFOs, and errno-to-error mapping.
#include "util/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "mirrored/errors.hpp"

namespace mirrored::detail {

const char* file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

ReadableFile::~ReadableFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadableFile& ReadableFile::operator=(ReadableFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
    size_ = other.size_;
  }
  return *this;
}

int ReadableFile::release() noexcept { return std::exchange(fd_, -1); }

void throw_file_error(const std::string& prefix, const char* what, const std::string& path, int err) {
  const std::string msg = str_cat(prefix, what, " '", path, "' failed: ", std::strerror(err));
  switch (err) {
    case ENOENT: throw NotFoundError(msg);
    case EACCES:
    case EPERM: throw PermissionDeniedError(msg);
    case EISDIR:
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG:
    case EINVAL: throw InvalidArgumentError(msg);
    case EROFS:
    case ENOSPC:
    case EDQUOT:
    case EFBIG: throw FailedPreconditionError(msg);
    default: throw UnavailableError(msg);
  }
}

ReadableFile open_regular_file(const std::string& path, const std::string& prefix) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  ReadableFile file;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      file = ReadableFile(fd, 0);
      break;
    }
    if (errno == EINTR) continue;
    if (errno == ENOENT) throw NotFoundError(str_cat(prefix, "no such file or directory: '", path, "'"));
    throw_file_error(prefix, "opening", path, errno);
  }
  struct stat st {};
  if (::fstat(file.fd(), &st) != 0) throw_file_error(prefix, "stat of", path, errno);
  MIRRORED_ENFORCE(!S_ISDIR(st.st_mode), InvalidArgumentError, prefix, "'", path, "' is a directory, not a file");
  MIRRORED_ENFORCE(S_ISREG(st.st_mode), InvalidArgumentError, prefix, "'", path, "' is not a regular file (it is ",
                   file_kind(st.st_mode), ")");
  // A regular file never blocks, but reads should see ordinary blocking semantics all the same.
  const int flags = ::fcntl(file.fd(), F_GETFL);
  if (flags < 0 || ::fcntl(file.fd(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    throw_file_error(prefix, "fcntl of", path, errno);
  return ReadableFile(file.release(), static_cast<std::uint64_t>(st.st_size));
}

}  // namespace mirrored::detail
