// Atomic replacement of a file: a lock per target path, a fresh exclusive temporary file, rename.
#include "util/atomic_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>
#include <utility>

#include "mirrored/errors.hpp"
#include "util/files.hpp"

namespace mirrored::detail {
namespace {

constexpr int kLockAttempts = 8;  // each retry follows a lock file unlinked by the previous holder
constexpr int kCreateAttempts = 16;

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string AtomicFileWriter::random_suffix() {
  static std::random_device device;
  const std::uint64_t v = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace {

/// Closes a descriptor on scope exit unless released.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void fsync_directory(const std::string& prefix, const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_file_error(prefix, "opening directory", dir, errno);
  // Some file systems cannot fsync a directory (EINVAL); the rename itself has happened.
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw_file_error(prefix, "fsyncing directory", dir, err);
}

}  // namespace

std::string AtomicFileWriter::temp_prefix(const std::string& path) { return path + ".tmp."; }
std::string AtomicFileWriter::lock_path(const std::string& path) { return path + ".lock"; }

AtomicFileWriter::AtomicFileWriter(std::string path, std::string prefix)
    : AtomicFileWriter(std::move(path), std::move(prefix), Locking::own_lock) {}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string prefix, Locking locking)
    : path_(std::move(path)), prefix_(std::move(prefix)), dir_(directory_of(path_)) {
  if (locking == Locking::held_by_caller) {
    create_temp();
    return;
  }
  lock();
  try {
    remove_stale_temps();
    create_temp();
  } catch (...) {
    unlock();
    throw;
  }
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string prefix, const std::string& reuse)
    : path_(std::move(path)), prefix_(std::move(prefix)), dir_(directory_of(path_)) {
  if (!adopt(reuse)) create_temp();
}

bool AtomicFileWriter::adopt(const std::string& reuse) {
  if (reuse.empty()) return false;
  // Checked on what was opened: a symlink (O_NOFOLLOW) or FIFO (O_NONBLOCK) put in its place is
  // never written through or waited on, nor a file linked elsewhere.
  Fd fd(::open(reuse.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) return false;
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
      st.st_uid != ::geteuid()) {
    ::unlink(reuse.c_str());  // the caller's own name, for a file of no further use
    return false;
  }
  fd_ = fd.release();
  temp_ = reuse;
  reused_size_ = static_cast<long long>(st.st_size);
  return true;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
  unlock();
}

void AtomicFileWriter::lock() {
  const std::string lock = lock_path(path_);
  for (int attempt = 0; attempt < kLockAttempts; ++attempt) {
    // O_NOFOLLOW: a planted symlink is refused (ELOOP); O_NONBLOCK: a planted FIFO cannot block.
    Fd fd(::open(lock.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      if (errno == EINTR) continue;
      throw_file_error(prefix_, "creating lock file", lock, errno);
    }
    struct stat by_fd {};
    if (::fstat(fd.get(), &by_fd) != 0) throw_file_error(prefix_, "stat of", lock, errno);
    MIRRORED_ENFORCE(S_ISREG(by_fd.st_mode), InvalidArgumentError, prefix_, "lock file '", lock,
                     "' is not a regular file (it is ", file_kind(by_fd.st_mode), ")");
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno == EWOULDBLOCK)
        throw FailedPreconditionError(
            str_cat(prefix_, "another save to this path is in progress (", lock, " is locked)"));
      throw_file_error(prefix_, "locking", lock, errno);
    }
    // The previous holder unlinks the lock file when it is done: make sure the locked file is
    // still the one at that name, else lock the new one.
    struct stat by_name {};
    if (::lstat(lock.c_str(), &by_name) != 0 || by_name.st_ino != by_fd.st_ino || by_name.st_dev != by_fd.st_dev)
      continue;
    lock_fd_ = fd.release();
    return;
  }
  throw FailedPreconditionError(str_cat(prefix_, "could not lock ", lock, " (concurrent saves?)"));
}

void AtomicFileWriter::unlock() noexcept {
  if (lock_fd_ < 0) return;
  ::unlink(lock_path(path_).c_str());  // before releasing the lock: see lock()
  ::close(lock_fd_);
  lock_fd_ = -1;
}

void AtomicFileWriter::remove_stale_temps() {
  // Only the lock holder writes temporary files, so any there now belong to crashed saves.
  // Best effort: a leftover that cannot be removed does no harm (the new one gets another name).
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return;
  const std::string stale = base_name(temp_prefix(path_));
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > stale.size() && name.compare(0, stale.size(), stale) == 0) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

void AtomicFileWriter::create_temp() {
  for (int attempt = 0; attempt < kCreateAttempts; ++attempt) {
    std::string candidate = temp_prefix(path_) + random_suffix();
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
      fd_ = fd;
      temp_ = std::move(candidate);
      return;
    }
    if (errno == EEXIST || errno == EINTR) continue;  // planted or raced: another name
    throw_file_error(prefix_, "creating", candidate, errno);
  }
  throw UnavailableError(str_cat(prefix_, "could not create a new temporary file ", temp_prefix(path_), "* after ",
                                 kCreateAttempts, " attempts"));
}

void AtomicFileWriter::sync_directory(const std::string& prefix, const std::string& dir) {
  fsync_directory(prefix, dir);
}

std::string AtomicFileWriter::commit(bool sync_file, bool sync_directory, bool keep_old) {
  if (reused_size_ >= 0) {
    // The new version ends where the writes did; the old one may have been longer.
    const off_t end = ::lseek(fd_, 0, SEEK_CUR);
    if (end < 0) throw_file_error(prefix_, "seeking in", temp_, errno);
    if (end < reused_size_ && ::ftruncate(fd_, end) != 0) throw_file_error(prefix_, "truncating", temp_, errno);
  }
  if (sync_file && ::fsync(fd_) != 0) throw_file_error(prefix_, "fsyncing", temp_, errno);
  std::string old_version;
  if (keep_old && ::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) == 0) {
    old_version = temp_;
  } else if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw_file_error(prefix_, "renaming", temp_, errno);
  }
  committed_ = true;
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw_file_error(prefix_, "closing", path_, errno);
  if (sync_directory) fsync_directory(prefix_, dir_);
  unlock();
  return old_version;
}

}  // namespace mirrored::detail
