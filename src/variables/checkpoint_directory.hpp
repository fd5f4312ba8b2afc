#pragma once
// Private: the files of a checkpoint manager's directory (include/mirrored/checkpoint_manager.hpp
// names them): the data files' names and steps, the stray files of crashed saves and gone managers,
// TF's text index, a scan of the directory.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mirrored::checkpoint::manager_files {

inline constexpr std::string_view kIndexName = "checkpoint";
inline constexpr std::string_view kDataPrefix = "ckpt-";
inline constexpr std::string_view kDataSuffix = ".safetensors";
inline constexpr const char* kStepKey = "mirrored.manager.step";
inline constexpr std::string_view kLatestKey = "model_checkpoint_path";
inline constexpr std::string_view kAllKey = "all_model_checkpoint_paths";
/// An index larger than this is not one the manager wrote (it lists at most max_to_keep names).
inline constexpr std::size_t kMaxIndexBytes = std::size_t{1} << 20;

/// `ckpt-<step>.safetensors`.
std::string data_name(int64_t step);

/// The step of a data file's name `ckpt-<digits>.safetensors` (any step `save` accepts: 0 to
/// INT64_MAX), or nullopt for any other name, one whose number exceeds INT64_MAX included.
std::optional<int64_t> step_of(std::string_view name);

/// A dropped checkpoint's file kept to write the next save into: `.ckpt-spare.<suffix>`.
inline constexpr std::string_view kSparePrefix = ".ckpt-spare.";

/// A stray file of a crashed save: `ckpt-<n>.safetensors.tmp.<suffix>`, `checkpoint.tmp.<suffix>`,
/// a spare of a manager that has gone (another manager's spare is only kept while it is the one
/// saving), or the lock files earlier versions made (`ckpt-<n>.safetensors.lock`, `checkpoint.lock`).
bool is_stray(std::string_view name);

/// The index: the kept data files' names, oldest first (the last is the newest).
struct Index {
  std::vector<std::string> kept;
};

/// Parses the index text; nullopt when it is not an index the manager wrote.
std::optional<Index> parse_index(std::string_view text);

/// The index text of `index` (TF's `checkpoint` file form; `kept` must not be empty).
std::string format_index(const Index& index);

/// The data files of `dir` by step (regular files named `ckpt-<n>.safetensors`), highest first.
std::vector<std::pair<int64_t, std::string>> scan(const std::string& dir);

/// Whether `path` is a regular file (following symlinks).
bool exists_regular(const std::string& path);

/// The index of `dir`, or nullopt when it is missing, unreadable as an index or corrupt (a
/// warning says which, except when missing).
std::optional<Index> read_index(const std::string& dir, const std::string& who);

/// Writes all of `text` to `fd`. \throws the errors of `detail::throw_file_error` naming `file`.
void write_all_fd(int fd, const std::string& text, const std::string& who, const std::string& file);

// ---------------------------------------------------------------------------------------------
// The steps of a save, on the chief, in their order (`CheckpointManager::save` runs them).

/// A save's exclusive `flock` on the directory `dir_fd` (one save of a directory at a time, across
/// processes), released by the destructor. \throws FailedPreconditionError when another save
/// holds it (no waiting); the errors of `detail::throw_file_error` for any other failure.
class DirectoryLock {
 public:
  DirectoryLock(int dir_fd, const std::string& dir, const std::string& who);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_;
};

/// The checkpoints `dir` keeps now, oldest first: its index, or, when that is missing or corrupt,
/// its data files by step. Call it holding the directory's lock.
Index kept_checkpoints(const std::string& dir, const std::string& who);

/// Makes `name` the newest of `index` (moved to the end when already kept) and drops the oldest
/// beyond `max_to_keep`.
void keep_newest(Index& index, const std::string& name, int max_to_keep);

/// Writes `index` as `dir`'s index (atomically, not fsynced: a hint that a scan replaces),
/// into `index_spare` (a name in `dir`, or empty) when there is one. On return `index_spare` names
/// the file of the index just replaced, kept for the next save, or is empty.
void write_index(const std::string& dir, const Index& index, std::string& index_spare, const std::string& who);

/// One pass over `dir` after a save: removes what crashed saves and gone managers left (`is_stray`)
/// and the data files `index` does not keep (older ones, and any a crash left unindexed), except
/// that the first of those becomes `data_spare` (renamed, never over an existing name) when that
/// is empty. `index_spare` and `data_spare` are this manager's and stay.
void sweep(const std::string& dir, const Index& index, std::string& data_spare, const std::string& index_spare,
           const std::string& who);

}  // namespace mirrored::checkpoint::manager_files
