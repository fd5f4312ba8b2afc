// The files of a checkpoint manager's directory (variables/checkpoint_directory.hpp).
#include "variables/checkpoint_directory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"
#include "util/atomic_file.hpp"
#include "util/files.hpp"
#include "util/log.hpp"

namespace mirrored::checkpoint::manager_files {

using detail::str_cat;

std::string data_name(int64_t step) { return str_cat(kDataPrefix, step, kDataSuffix); }

/// The step of a data file's name `ckpt-<digits>.safetensors` (0 to INT64_MAX), or nullopt.
std::optional<int64_t> step_of(std::string_view name) {
  if (name.size() <= kDataPrefix.size() + kDataSuffix.size() || name.substr(0, kDataPrefix.size()) != kDataPrefix ||
      name.substr(name.size() - kDataSuffix.size()) != kDataSuffix)
    return std::nullopt;
  const std::string_view digits =
      name.substr(kDataPrefix.size(), name.size() - kDataPrefix.size() - kDataSuffix.size());
  // Every step save accepts, up to INT64_MAX (19 digits: a timestamp in nanoseconds is one), and
  // nothing beyond it: a name that would overflow is no checkpoint's.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (step > (kMax - digit) / 10) return std::nullopt;
    step = step * 10 + digit;
  }
  return step;
}

/// A stray file of a crashed save: `ckpt-<n>.safetensors.tmp.<suffix>`, `checkpoint.tmp.<suffix>`,
/// a spare of a manager that has gone (another manager's spare is only kept while it is the one
/// saving), or the lock files earlier versions made (`ckpt-<n>.safetensors.lock`, `checkpoint.lock`).
bool is_stray(std::string_view name) {
  if (name.substr(0, kSparePrefix.size()) == kSparePrefix) return name.size() > kSparePrefix.size();
  if (name.substr(0, kIndexName.size()) == kIndexName) {
    const std::string_view rest = name.substr(kIndexName.size());
    return rest == ".lock" || (rest.size() > 5 && rest.substr(0, 5) == ".tmp.");
  }
  const auto end = name.find(kDataSuffix);
  if (end == std::string_view::npos || !step_of(name.substr(0, end + kDataSuffix.size()))) return false;
  const std::string_view rest = name.substr(end + kDataSuffix.size());
  return rest == ".lock" || (rest.size() > 5 && rest.substr(0, 5) == ".tmp.");
}

/// Parses the index text; nullopt when it is not an index the manager wrote.
std::optional<Index> parse_index(std::string_view text) {
  Index index;
  std::optional<std::string> latest;
  while (!text.empty()) {
    const auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.empty()) continue;
    const auto colon = line.find(": \"");
    if (colon == std::string_view::npos || line.back() != '"') return std::nullopt;
    const std::string_view key = line.substr(0, colon);
    const std::string_view value = line.substr(colon + 3, line.size() - colon - 4);
    if (!step_of(value)) return std::nullopt;  // never a path elsewhere ("../x"): names of this directory only
    if (key == kLatestKey) {
      if (latest) return std::nullopt;
      latest = std::string(value);
    } else if (key == kAllKey) {
      if (std::find(index.kept.begin(), index.kept.end(), value) != index.kept.end()) return std::nullopt;
      index.kept.emplace_back(value);
    } else {
      return std::nullopt;
    }
  }
  if (!latest || index.kept.empty() || index.kept.back() != *latest) return std::nullopt;
  return index;
}

std::string format_index(const Index& index) {
  std::string out = str_cat(kLatestKey, ": \"", index.kept.back(), "\"\n");
  for (const auto& name : index.kept) out += str_cat(kAllKey, ": \"", name, "\"\n");
  return out;
}

/// The data files of `dir` by step (regular files named `ckpt-<n>.safetensors`), highest first.
std::vector<std::pair<int64_t, std::string>> scan(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    const auto step = step_of(e->d_name);
    struct stat st {};
    if (step && ::fstatat(::dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
      out.emplace_back(*step, e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

bool exists_regular(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

/// The index of `dir`, or nullopt when it is missing, unreadable as an index or corrupt (a
/// warning says which, except when missing).
std::optional<Index> read_index(const std::string& dir, const std::string& who) {
  const std::string path = str_cat(dir, "/", kIndexName);
  std::string text;
  try {
    const detail::ReadableFile f = detail::open_regular_file(path, who);
    if (f.size() > kMaxIndexBytes) {
      MIRRORED_LOG(warn, who, "index '", path, "' has ", f.size(), " bytes, not an index; scanning the directory");
      return std::nullopt;
    }
    text.resize(static_cast<std::size_t>(f.size()));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(f.fd(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    text.resize(done);
  } catch (const NotFoundError&) {
    return std::nullopt;
  } catch (const Error& e) {
    MIRRORED_LOG(warn, e.what(), "; scanning the directory instead of reading the index");
    return std::nullopt;
  }
  auto index = parse_index(text);
  if (!index) MIRRORED_LOG(warn, who, "index '", path, "' is corrupt; scanning the directory");
  return index;
}

void write_all_fd(int fd, const std::string& text, const std::string& who, const std::string& file) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_file_error(who, "writing", file, errno);
    }
    done += static_cast<std::size_t>(n);
  }
}

DirectoryLock::DirectoryLock(int dir_fd, const std::string& dir, const std::string& who) : fd_(dir_fd) {
  // Not waiting: a second save of the directory while one runs is a mistake to report (two jobs
  // on one directory), not a queue.
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK)
      throw FailedPreconditionError(str_cat(who, "another save to this directory is in progress"));
    detail::throw_file_error(who, "locking directory", dir, errno);
  }
}

DirectoryLock::~DirectoryLock() { ::flock(fd_, LOCK_UN); }

Index kept_checkpoints(const std::string& dir, const std::string& who) {
  if (auto index = read_index(dir, who)) return std::move(*index);
  Index index;
  const auto files = scan(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) index.kept.push_back(it->second);
  return index;
}

void keep_newest(Index& index, const std::string& name, int max_to_keep) {
  // Saving a step again makes it the newest: the order of saves, as TF's manager keeps it.
  index.kept.erase(std::remove(index.kept.begin(), index.kept.end(), name), index.kept.end());
  index.kept.push_back(name);
  if (index.kept.size() > static_cast<std::size_t>(max_to_keep))
    index.kept.erase(index.kept.begin(), index.kept.end() - max_to_keep);
}

void write_index(const std::string& dir, const Index& index, std::string& index_spare, const std::string& who) {
  const std::string path = str_cat(dir, "/", kIndexName);
  // Written into the previous index's file when this manager kept it, and exchanged with the
  // index there now, which becomes the spare of the next save's index. Taken now: whatever
  // happens below, the old name is of no further use.
  const std::string spare = std::exchange(index_spare, std::string());
  detail::AtomicFileWriter file =
      spare.empty() ? detail::AtomicFileWriter(path, who, detail::AtomicFileWriter::Locking::held_by_caller)
                    : detail::AtomicFileWriter(path, who, str_cat(dir, "/", spare));
  write_all_fd(file.fd(), format_index(index), who, file.temp_path());
  const std::string old_index = file.commit(/*sync_file=*/false, /*sync_directory=*/false, /*keep_old=*/true);
  if (!spare.empty() && old_index == str_cat(dir, "/", spare)) {
    index_spare = spare;  // the spare's name now holds the index just replaced
  } else if (!old_index.empty()) {
    // The first exchange: the replaced index is under a temporary name; give it a spare's.
    std::string name = str_cat(kSparePrefix, detail::AtomicFileWriter::random_suffix());
    if (::renameat2(AT_FDCWD, old_index.c_str(), AT_FDCWD, str_cat(dir, "/", name).c_str(), RENAME_NOREPLACE) == 0)
      index_spare = std::move(name);
    else
      ::unlink(old_index.c_str());
  }
}

void sweep(const std::string& dir, const Index& index, std::string& data_spare, const std::string& index_spare,
           const std::string& who) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;  // nothing removed: the next save tries again
  while (const dirent* e = ::readdir(d)) {
    const std::string_view file = e->d_name;
    if (file == data_spare || file == index_spare) continue;  // this manager's spares
    if (is_stray(file)) {
      ::unlinkat(::dirfd(d), e->d_name, 0);
      continue;
    }
    if (!step_of(file) || std::find(index.kept.begin(), index.kept.end(), file) != index.kept.end()) continue;
    if (data_spare.empty()) {
      std::string candidate = str_cat(kSparePrefix, detail::AtomicFileWriter::random_suffix());
      if (::renameat2(::dirfd(d), e->d_name, ::dirfd(d), candidate.c_str(), RENAME_NOREPLACE) == 0) {
        data_spare = std::move(candidate);
        continue;
      }
    }
    if (::unlinkat(::dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
      MIRRORED_LOG(warn, who, "could not delete the old checkpoint '", dir, "/", file, "': ", std::strerror(errno));
  }
  ::closedir(d);
}

}  // namespace mirrored::checkpoint::manager_files
