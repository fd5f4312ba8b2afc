// checkpoint::CheckpointManager: numbered checkpoints in a directory, an index, max_to_keep (see
// include/mirrored/checkpoint_manager.hpp for the layout and the rules).

#include "mirrored/checkpoint_manager.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>
#include <utility>

#include "mirrored/detail/format.hpp"
#include "runtime/default_strategy.hpp"
#include "runtime/thread_state.hpp"
#include "util/atomic_file.hpp"
#include "util/files.hpp"
#include "util/log.hpp"
#include "variables/checkpoint_directory.hpp"
#include "variables/checkpoint_header.hpp"

namespace mirrored::checkpoint {
// File-local helpers, in a namespace of their own (the unity build joins this file with the
// other checkpoint sources).
namespace manager_files {

using detail::str_cat;

void require_cross_replica_manager(const char* op) {
  const auto& ts = detail::thread_state();
  MIRRORED_ENFORCE(!ts.replica || detail::is_default_context(ts.replica), FailedPreconditionError, "CheckpointManager.",
                   op, " called on replica ", ts.replica ? ts.replica->replica_id_in_sync_group() : 0,
                   " inside run; call it in cross-replica context (outside run)");
}

int local_replicas(Strategy& s) { return static_cast<int>(s.extended().worker_devices().size()); }

/// Every worker's `value` (one per worker, in worker order): a gather across the workers in which
/// each worker's first replica carries its value.
std::vector<int64_t> gather_per_worker(Strategy& s, int64_t value) {
  const int local = local_replicas(s);
  std::vector<Tensor<int64_t>> parts;
  for (int r = 0; r < local; ++r) parts.push_back(Tensor<int64_t>::from_vector({r == 0 ? value : 0}, {1}));
  const Tensor<int64_t> all = s.gather(PerReplica<Tensor<int64_t>>(std::move(parts)), 0);
  const std::vector<int64_t> v = all.to_vector();
  std::vector<int64_t> out;
  for (std::size_t k = 0; k < v.size(); k += static_cast<std::size_t>(local)) out.push_back(v[k]);
  return out;
}

/// Every worker's `bytes`, in worker order: their lengths first, then the bytes, padded to the
/// longest (each worker's first replica carries them).
std::vector<std::string> gather_bytes_per_worker(Strategy& s, const std::string& bytes) {
  const std::vector<int64_t> lengths = gather_per_worker(s, static_cast<int64_t>(bytes.size()));
  const int64_t width = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  const int local = local_replicas(s);
  std::vector<Tensor<uint8_t>> parts;
  for (int r = 0; r < local; ++r) {
    Tensor<uint8_t> t = Tensor<uint8_t>::zeros({width});
    if (r == 0 && !bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
    parts.push_back(std::move(t));
  }
  const Tensor<uint8_t> all = s.gather(PerReplica<Tensor<uint8_t>>(std::move(parts)), 0);
  std::vector<std::string> out;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    const auto* p = all.data() + static_cast<int64_t>(k) * local * width;
    out.emplace_back(reinterpret_cast<const char*>(p), static_cast<std::size_t>(lengths[k]));
  }
  return out;
}

/// Every worker learns whether the chief's write succeeded (a collective of every worker): rethrows
/// this worker's `failure`, or throws UnavailableError on a worker whose own part succeeded when the
/// chief's failed.
void agree_on_outcome(Strategy& s, const std::exception_ptr& failure, const std::string& who, const std::string& path) {
  if (s.extended().num_workers() > 1) {
    const std::vector<int64_t> ok = gather_per_worker(s, failure ? 0 : 1);
    if (!failure && ok.front() == 0)
      throw UnavailableError(str_cat(who, "the chief (worker 0) failed to write '", path, "' (see its log)"));
  }
  if (failure) std::rethrow_exception(failure);
}

detail::UntypedTensor bytes_tensor(const std::string& bytes) {
  Tensor<uint8_t> t = Tensor<uint8_t>::empty({static_cast<int64_t>(bytes.size())});
  if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
  return untyped(t);
}

}  // namespace manager_files

using detail::str_cat;
namespace mf = manager_files;

CheckpointManager::CheckpointManager(Strategy& strategy, std::string directory, int max_to_keep,
                                     CheckpointManagerOptions options)
    : strategy_(strategy), directory_(std::move(directory)), max_to_keep_(max_to_keep), options_(options) {
  MIRRORED_ENFORCE(!directory_.empty(), InvalidArgumentError, "CheckpointManager: empty directory name");
  MIRRORED_ENFORCE(max_to_keep_ >= 1, InvalidArgumentError, "CheckpointManager('", directory_,
                   "'): max_to_keep must be >= 1, got ", max_to_keep_);
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
}

CheckpointManager::~CheckpointManager() {
  // Files of this manager's alone (random names).
  for (const std::string* spare : {&spare_, &index_spare_})
    if (!spare->empty()) ::unlink((directory_ + "/" + *spare).c_str());
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

int CheckpointManager::directory_fd(const std::string& who) {
  struct stat by_name {};
  if (dir_fd_ >= 0) {
    struct stat by_fd {};
    if (::stat(directory_.c_str(), &by_name) == 0 && ::fstat(dir_fd_, &by_fd) == 0 && by_name.st_ino == by_fd.st_ino &&
        by_name.st_dev == by_fd.st_dev)
      return dir_fd_;
    ::close(dir_fd_);  // removed or replaced since: lock and write the one there now
    dir_fd_ = -1;
  }
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec) detail::throw_file_error(who, "creating directory", directory_, ec.value());
  const int fd = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) detail::throw_file_error(who, "opening directory", directory_, errno);
  dir_fd_ = fd;
  return dir_fd_;
}

void CheckpointManager::add(const std::string& name, detail::CheckpointTrackable t) {
  MIRRORED_ENFORCE(!name.empty(), InvalidArgumentError, "CheckpointManager('", directory_, "').track: empty name");
  MIRRORED_ENFORCE(tracked_.count(name) == 0, InvalidArgumentError, "CheckpointManager('", directory_,
                   "').track: the name '", name, "' is already tracked (a ", tracked_.at(name).kind, ")");
  tracked_.emplace(name, std::move(t));
}

void CheckpointManager::add_variable(const std::string& name, const void* state, std::any handle,
                                     detail::CheckpointTrackable t) {
  if (const std::string* other = tracked_variable_name(state))
    throw InvalidArgumentError(str_cat("CheckpointManager('", directory_, "').track: the variable tracked as '", name,
                                       "' is already tracked as '", *other, "'"));
  add(name, std::move(t));
  variables_.emplace(name, TrackedVariable{state, std::move(handle)});
}

const std::string* CheckpointManager::tracked_variable_name(const void* state) const {
  for (const auto& [name, v] : variables_)
    if (v.state == state) return &name;
  return nullptr;
}

void CheckpointManager::add_tensor(TensorMap& out, const std::string& name, detail::UntypedTensor t,
                                   const std::string& owner) {
  MIRRORED_ENFORCE(out.count(name) == 0, InvalidArgumentError, "CheckpointManager.save: ", owner,
                   " stores the tensor name '", name, "', which another tracked object stores too; rename one");
  out.emplace(name, std::move(t));
}

void CheckpointManager::throw_untracked_slot(const std::string& optimizer, const std::string& slot_variable,
                                             const char* op) {
  throw InvalidArgumentError(str_cat("CheckpointManager.", op, ": optimizer '", optimizer, "' has the slot '",
                                     slot_variable,
                                     "' of a variable this manager does not track; track every variable the "
                                     "optimizer updates (manager.track(name, variable))"));
}

void CheckpointManager::track_state(const std::string& name, std::function<std::string()> save_fn,
                                    std::function<void(const std::string&)> restore_fn,
                                    std::function<void(const std::vector<std::string>&)> restore_all) {
  const std::string count_key = name + "/num_workers";
  auto worker_key = [name](int64_t k) { return str_cat(name, "/worker_", k); };
  detail::CheckpointTrackable t;
  t.kind = "iterator";
  t.save = [this, name, save_fn, count_key, worker_key](TensorMap& out) {
    const std::string mine = save_fn();
    const int workers = strategy_.extended().num_workers();
    const std::string owner = "iterator '" + name + "'";
    add_tensor(out, count_key, untyped(Tensor<int64_t>::scalar(workers)), owner);
    if (workers == 1) {
      add_tensor(out, worker_key(0), mf::bytes_tensor(mine), owner);
      return;
    }
    const std::vector<std::string> all = mf::gather_bytes_per_worker(strategy_, mine);
    for (std::size_t k = 0; k < all.size(); ++k)
      add_tensor(out, worker_key(static_cast<int64_t>(k)), mf::bytes_tensor(all[k]), owner);
  };
  const bool elastic = static_cast<bool>(restore_all);
  t.check = [this, name, count_key, worker_key, elastic](const Checkpoint& ckpt, std::set<std::string>& claimed) {
    ckpt.check(count_key, DType::int64, {});
    const int64_t saved = ckpt.get<int64_t>(count_key).item();
    const int workers = strategy_.extended().num_workers();
    // Another worker count restores where the iterator resumes elsewhere (it decides); a count
    // below 1 is no checkpoint of workers, and each of them must have its state below.
    MIRRORED_ENFORCE((elastic && saved >= 1) || saved == workers, InvalidArgumentError, "checkpoint '", ckpt.path(),
                     "': iterator '", name, "' was saved by ", saved, " worker(s), this run has ", workers,
                     "; an iterator's position restores only with the same number of workers");
    claimed.insert(count_key);
    for (int64_t k = 0; k < saved; ++k) {
      const std::string key = worker_key(k);
      const detail::UntypedTensor& u = ckpt.at(key);
      MIRRORED_ENFORCE(u.dtype == DType::uint8 && u.shape.size() == 1, InvalidArgumentError, "checkpoint '",
                       ckpt.path(), "': tensor '", key, "' (iterator state) is ", dtype_name(u.dtype), " of shape ",
                       detail::format_shape(u.shape), ", expected uint8 of rank 1");
      claimed.insert(key);
    }
  };
  t.prepare = [this, name, save_fn, restore_fn, restore_all, worker_key, count_key](const Checkpoint& ckpt) {
    const auto state_of = [&](int64_t k) {
      const detail::UntypedTensor& u = ckpt.at(worker_key(k));
      return std::string(static_cast<const char*>(u.data()), u.bytes());
    };
    std::vector<std::string> states;
    if (restore_all) {
      const int64_t saved = ckpt.get<int64_t>(count_key).item();
      for (int64_t k = 0; k < saved; ++k) states.push_back(state_of(k));
    } else {
      states.push_back(state_of(strategy_.extended().worker_index()));
    }
    std::string before = save_fn();
    std::string path = ckpt.path();
    detail::CheckpointRestoreStep step;
    step.apply = [restore_fn, restore_all, states = std::move(states), path = std::move(path), name] {
      try {
        if (restore_all)
          restore_all(states);
        else
          restore_fn(states[0]);
      } catch (const InvalidArgumentError& e) {
        throw InvalidArgumentError(str_cat("checkpoint '", path, "': iterator '", name, "': ", e.what()));
      }
    };
    step.undo = [restore_fn, before = std::move(before)] { restore_fn(before); };
    return step;
  };
  add(name, std::move(t));
}

void CheckpointManager::set_metadata(const std::string& key, std::string value) {
  MIRRORED_ENFORCE(!key.empty(), InvalidArgumentError, "CheckpointManager.set_metadata: empty key");
  MIRRORED_ENFORCE(key.rfind("mirrored.", 0) != 0, InvalidArgumentError, "CheckpointManager.set_metadata: key '", key,
                   "' is reserved (keys starting with 'mirrored.' are the library's)");
  metadata_[key] = std::move(value);
}

std::optional<std::string> CheckpointManager::metadata(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> CheckpointManager::latest_checkpoint() const {
  const std::string who = str_cat("CheckpointManager('", directory_, "'): ");
  struct stat st {};
  if (::stat(directory_.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    detail::throw_file_error(who, "stat of directory", directory_, errno);
  }
  MIRRORED_ENFORCE(S_ISDIR(st.st_mode), InvalidArgumentError, who, "'", directory_, "' is not a directory (it is ",
                   detail::file_kind(st.st_mode), ")");
  MIRRORED_ENFORCE(::access(directory_.c_str(), R_OK | X_OK) == 0, PermissionDeniedError, who, "directory '",
                   directory_, "' cannot be read: ", std::strerror(errno));
  if (const auto index = mf::read_index(directory_, who)) {
    const std::string path = directory_ + "/" + index->kept.back();
    if (mf::exists_regular(path)) return path;
    MIRRORED_LOG(warn, who, "the index names '", path, "', which is missing; scanning the directory");
  }
  const auto files = mf::scan(directory_);
  if (files.empty()) return std::nullopt;
  return directory_ + "/" + files.front().second;
}

std::string CheckpointManager::save(int64_t step) {
  mf::require_cross_replica_manager("save");
  MIRRORED_ENFORCE(step >= 0, InvalidArgumentError, "CheckpointManager('", directory_,
                   "').save: step must be >= 0, got ", step);
  const std::string path = directory_ + "/" + mf::data_name(step);
  const std::string who = str_cat("CheckpointManager('", directory_, "').save: ");

  // Every worker gathers what it must (collectives), in name order.
  TensorMap tensors;
  for (const auto& [tracked_name, t] : tracked_) t.save(tensors);

  std::exception_ptr failure;
  if (strategy_.extended().should_checkpoint()) {
    try {
      write_checkpoint(step, tensors, who);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  mf::agree_on_outcome(strategy_, failure, who, path);
  return path;
}

void CheckpointManager::write_checkpoint(int64_t step, const TensorMap& tensors, const std::string& who) {
  const std::string name = mf::data_name(step);
  // One save of the directory at a time: a lock on the directory itself, so every temporary file
  // present now is a crashed save's, and the files this save writes need no lock of their own.
  const mf::DirectoryLock locked(directory_fd(who), directory_, who);
  // Read under the lock at every save, never taken from what this manager wrote last: another
  // manager or process may have saved since (the index then lists its checkpoints too), and no
  // check of the file's identity tells: the spare exchange brings this manager's own inode back as
  // the other's index, and a freed inode number is reused.
  mf::Index index = mf::kept_checkpoints(directory_, who);
  // The data file is fsynced before its rename, so no machine crash leaves a partial file under a
  // checkpoint's name; the index is not (a hint: a truncated or lost one makes latest_checkpoint
  // scan the directory). Into the spare when there is one (the file of a checkpoint an earlier
  // save dropped): taken now, whether or not it can be used (if not, it is gone, or removed with
  // the strays by the sweep).
  const std::string spare = std::exchange(spare_, std::string());
  internal::save_tensors_with(directory_ + "/" + name, tensors, metadata_, {{mf::kStepKey, std::to_string(step)}},
                              /*sync_directory=*/false, /*caller_holds_lock=*/true,
                              spare.empty() ? spare : directory_ + "/" + spare);
  mf::keep_newest(index, name, max_to_keep_);
  mf::write_index(directory_, index, index_spare_, who);
  // One directory fsync for both renames: the checkpoint survives a machine crash from here on.
  if (options_.sync_directory) detail::AtomicFileWriter::sync_directory(who, directory_);
  // What crashed saves left (none is this save's, whose files are renamed by now), and the data
  // files the index no longer keeps; one of those becomes the next save's spare.
  mf::sweep(directory_, index, spare_, index_spare_, who);
}

std::optional<int64_t> CheckpointManager::restore_or_initialize(RestoreOptions options) {
  mf::require_cross_replica_manager("restore_or_initialize");
  const std::string who = str_cat("CheckpointManager('", directory_, "').restore_or_initialize: ");
  const std::optional<std::string> latest = latest_checkpoint();
  if (!latest) {
    unrestored_.clear();
    return std::nullopt;
  }

  Checkpoint ckpt;
  try {
    ckpt = load(*latest);
  } catch (const InvalidArgumentError& e) {
    if (!options_.fall_back_to_valid_checkpoint) throw;
    MIRRORED_LOG(warn, who, e.what(), "; falling back to the newest valid checkpoint");
    bool found = false;
    for (const auto& [older_step, file] : mf::scan(directory_)) {
      const std::string candidate = directory_ + "/" + file;
      if (candidate == *latest) continue;
      try {
        ckpt = load(candidate);
        found = true;
        MIRRORED_LOG(warn, who, "restoring '", candidate, "' instead of the corrupt '", *latest, "'");
        break;
      } catch (const InvalidArgumentError& older) {
        MIRRORED_LOG(warn, who, older.what(), "; trying an older checkpoint");
      }
    }
    if (!found)
      throw InvalidArgumentError(str_cat(who, "no valid checkpoint in the directory; the newest: ", e.what()));
  }

  const std::string at = str_cat("checkpoint '", ckpt.path(), "': ");
  const auto step_it = ckpt.metadata().find(mf::kStepKey);
  MIRRORED_ENFORCE(step_it != ckpt.metadata().end(), InvalidArgumentError, at, "no '", mf::kStepKey,
                   "' in its metadata (not written by a CheckpointManager)");
  int64_t step = -1;
  try {
    std::size_t used = 0;
    step = std::stoll(step_it->second, &used);
    if (used != step_it->second.size()) step = -1;
  } catch (const std::exception&) {
  }
  MIRRORED_ENFORCE(step >= 0, InvalidArgumentError, at, "'", mf::kStepKey, "' is '", step_it->second, "', not a step");

  // Everything is checked before anything changes.
  std::set<std::string> claimed;
  for (const auto& [name, t] : tracked_) t.check(ckpt, claimed);
  std::vector<std::string> unrestored;
  for (const auto& [name, tensor] : ckpt.tensors())
    if (!claimed.count(name)) unrestored.push_back(name);
  if (!unrestored.empty() && !options.expect_partial) {
    std::string list;
    for (std::size_t i = 0; i < unrestored.size() && i < 20; ++i)
      list += str_cat(i ? ", " : "", "'", unrestored[i], "'");
    if (unrestored.size() > 20) list += ", ...";
    throw InvalidArgumentError(
        str_cat(at, "has ", unrestored.size(),
                " tensor(s) that nothing tracked here stores, which would not be restored: ", list,
                " (a checkpoint of another model? To restore only what is tracked here, such as the weights without "
                "optimizer slots or iterator states, pass RestoreOptions{.expect_partial = true})"));
  }

  std::vector<detail::CheckpointRestoreStep> steps;
  for (const auto& [name, t] : tracked_) steps.push_back(t.prepare(ckpt));
  // The steps that may fail (iterators) go first, undone if a later one fails; then the rest,
  // which cannot.
  std::vector<const detail::CheckpointRestoreStep*> applied;
  try {
    for (const auto& s : steps) {
      if (!s.undo) continue;
      s.apply();
      applied.push_back(&s);
    }
  } catch (...) {
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) (*it)->undo();
    throw;
  }
  for (const auto& s : steps)
    if (!s.undo) s.apply();
  Metadata user;
  for (const auto& [key, value] : ckpt.metadata())
    if (key.rfind("mirrored.", 0) != 0) user.emplace(key, value);
  metadata_ = std::move(user);
  unrestored_ = std::move(unrestored);
  return step;
}

}  // namespace mirrored::checkpoint
