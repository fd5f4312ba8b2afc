#pragma once
// Private: replacing a file atomically, as a hostile file system demands. Used by checkpoint saves.
#include <string>

namespace mirrored::detail {

/// Writes a new version of `path` beside it and renames it over `path` on `commit()`, so that a
/// crash at any point leaves either the old file or the new one, never a mix.
///
/// - Saves to one path are serialised by `<path>.lock`: opened without following a symlink, locked
///   with a non-blocking `flock`, unlinked by its holder when done. A second save while one is in
///   progress (in any process) fails at once; a lock file left by a crashed save is reused.
/// - Holding the lock, the constructor removes the temporary files of crashed saves to `path`
///   (`<path>.tmp.<suffix>`: only the lock holder writes them, so none is in use), then creates its
///   own under a fresh random suffix with `O_CREAT | O_EXCL | O_NOFOLLOW`: a planted file or
///   symlink is never opened, let alone written through.
/// - `commit()` fsyncs the temporary file, renames it over `path` and fsyncs the directory.
///   Destroying an uncommitted writer removes the temporary file.
///
/// Errors are the types of `throw_file_error`, with messages starting with `prefix`;
/// FailedPreconditionError when another save holds the lock ("another save to this path is in
/// progress").
class AtomicFileWriter {
 public:
  AtomicFileWriter(std::string path, std::string prefix);
  /// Who excludes other writers of `path`: the writer itself (its lock file, and it removes the
  /// temporary files of crashed saves first), or its caller, which holds a lock that covers
  /// `path` and has removed those files itself (a checkpoint manager's directory lock).
  enum class Locking { own_lock, held_by_caller };
  AtomicFileWriter(std::string path, std::string prefix, Locking locking);
  /// As `Locking::held_by_caller`, writing the new version into `reuse` instead of a new file:
  /// a file of the caller's that is no longer needed (a checkpoint manager's spare), in the
  /// directory of `path` under a name of the caller's own that no other process uses (a random
  /// one). It is overwritten in place from its start, and `commit()` cuts off what is left past
  /// the new end and renames it. Overwriting blocks the file system already holds skips freeing
  /// an old file's blocks and allocating a new one's: on ext4 a save of a small checkpoint then
  /// costs about what writing the same bytes to a fresh file does, where deleting one file and
  /// creating another cost half as much again. Opened without following a symlink and without
  /// blocking; used only when it is a regular file with a single link owned by this user (a hard
  /// link elsewhere is never written through): otherwise it is removed (it was of no further
  /// use) and a new temporary file is created as by the other constructors, as when `reuse` is
  /// empty or missing.
  AtomicFileWriter(std::string path, std::string prefix, const std::string& reuse);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// True when the temporary file is the `reuse` file of the constructor.
  bool reused() const noexcept { return reused_size_ >= 0; }
  /// The temporary file's descriptor (write-only) and name. Write the new version from offset 0
  /// (the descriptor's offset marks its end when a reused file is cut in `commit()`; `pwrite`
  /// may patch bytes before it).
  int fd() const noexcept { return fd_; }
  const std::string& temp_path() const noexcept { return temp_; }
  /// fsync, rename over the target, fsync the directory; then releases the lock. `sync_file`
  /// false skips the fsync (for a file whose loss or truncation by a machine crash its readers
  /// survive), `sync_directory` false the directory's (the caller syncs it once for several
  /// renames, or accepts that a machine crash may undo the rename: the old file then stays).
  ///
  /// `keep_old`: the new version is exchanged with the old one (`RENAME_EXCHANGE`) instead of
  /// renamed over it, and the name of the temporary file, which then holds the old version, is
  /// returned: a file to pass as `reuse` to the next save of `path` (an exchange frees no
  /// inode). Empty when there was no old version (or the file system cannot exchange: a plain
  /// rename then).
  std::string commit(bool sync_file = true, bool sync_directory = true, bool keep_old = false);
  /// fsyncs directory `dir` (EINVAL, a file system that cannot, is not an error). Messages start
  /// with `prefix`.
  static void sync_directory(const std::string& prefix, const std::string& dir);

  /// `<path>.tmp.`: every temporary file of a save to `path` starts with it.
  static std::string temp_prefix(const std::string& path);
  /// `<path>.lock`.
  static std::string lock_path(const std::string& path);
  /// 16 random hex digits: the suffix of a temporary file's name.
  static std::string random_suffix();

 private:
  void lock();
  void remove_stale_temps();
  void create_temp();
  bool adopt(const std::string& reuse);
  void unlock() noexcept;

  std::string path_, prefix_, dir_, temp_;
  int lock_fd_ = -1;
  int fd_ = -1;
  bool committed_ = false;
  long long reused_size_ = -1;  // the reused file's size when adopted, else -1
};

}  // namespace mirrored::detail
