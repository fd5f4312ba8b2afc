#pragma once
/// \file
/// `checkpoint::CheckpointManager`: TF's `tf.train.CheckpointManager` (with the object graph of a
/// `tf.train.Checkpoint`): it saves and restores what it tracks -- variables by name, optimizers
/// (their slots, sharded or not, and the step counter), distributed iterators and user metadata --
/// as numbered checkpoints in one directory, keeping the newest `max_to_keep`.
///
/// Directory layout (every file a manager writes is named here):
///
///     DIR/ckpt-<step>.safetensors   one checkpoint per saved step (the format of
///                                   <mirrored/checkpoint.hpp>, readable by Python's safetensors)
///     DIR/checkpoint                the index (TF's name and text form):
///                                       model_checkpoint_path: "ckpt-12.safetensors"
///                                       all_model_checkpoint_paths: "ckpt-10.safetensors"
///                                       all_model_checkpoint_paths: "ckpt-12.safetensors"
///                                   the kept checkpoints, oldest first, the newest first named
///     DIR/*.tmp.<random>            temporary files of a save in progress or a crashed one
///     DIR/.ckpt-spare.<random>      (two) a dropped checkpoint's file and the index a save
///                                   replaced, kept by the manager to write its next save's
///                                   data file and index into: overwriting blocks the file
///                                   system holds is faster than deleting files and creating
///                                   others. Removed by that manager's destructor, or as strays
///                                   by a later save when the manager has gone. (So a reader
///                                   still reading a checkpoint when a save more than
///                                   `max_to_keep` saves later reuses its file sees it change:
///                                   its checksum then fails.)
///
/// A save holds a `flock` on the directory itself (one save of a directory at a time, across
/// processes; no lock file to create or remove), so every temporary file it finds belongs to a
/// crashed save and is removed (as are lock files of earlier versions, `*.lock`). Each save reads
/// the index under that lock, so managers (in one process or several) saving into one directory
/// one after the other share one list of kept checkpoints: none drops another's checkpoint that is
/// among the newest `max_to_keep` saved into the directory.
///
/// Names inside a checkpoint file: a variable's tensor is the name it is tracked under;
/// an optimizer tracked as `opt` stores `opt/<variable name>/<slot>` for every slot of every
/// tracked variable it has slots for (whole values, also when sharded) and `opt/iterations`
/// (int64 scalar); an iterator tracked as `it` stores `it/num_workers` (int64 scalar) and
/// `it/worker_<k>` (uint8, the opaque state of worker k's iterator) for every worker. The
/// `__metadata__` holds the user metadata and `mirrored.manager.step`.
///
/// A save writes the data file atomically (see `save_tensors`; durability: see
/// `CheckpointManagerOptions::sync_directory`), then the index (atomically, after the data file),
/// then deletes the checkpoints beyond `max_to_keep` and any other
/// `ckpt-<n>.safetensors` the index does not keep (the directory belongs to the manager), keeping
/// one of them as the spare. A crash
/// at any point leaves the previous checkpoint usable and indexed; the next save removes the
/// temporary and lock files that the crashed one left. `latest_checkpoint` reads the index; when
/// the index is missing or corrupt (or names a file that is gone) it takes the highest-numbered
/// `ckpt-<n>.safetensors` of the directory.
///
/// Several workers (`MultiWorkerMirroredStrategy`): every worker constructs the manager on the same
/// directory, tracks the same objects, and calls `save` and `restore_or_initialize` together (as
/// TF's multi-worker saving does): a save gathers sharded optimizer slots and every worker's
/// iterator state (collectives of every worker), only the chief (worker 0,
/// `extended().should_checkpoint()`) writes files, and every worker learns whether the chief's
/// write succeeded. Every worker restores by reading the directory itself, so the directory must
/// be one every worker can read (a shared file system).
///
/// Call the manager from one thread, in cross-replica context (outside `run`). The optimizers and
/// iterators it tracks are held by reference and must outlive it.

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/checkpoint.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/optimizers.hpp"
#include "mirrored/strategy.hpp"
#include "mirrored/variable.hpp"
#include "mirrored/variable_checkpoint.hpp"

namespace mirrored {
template <class E>
class DistributedIterator;  // distributed_dataset.hpp
}  // namespace mirrored

namespace mirrored::detail {

/// What restoring one tracked object does once every check has passed: `apply` installs the
/// restored state. It cannot fail unless `undo` is set (an iterator's `restore_state` may throw),
/// in which case `undo` puts back what was there before (and cannot fail).
struct CheckpointRestoreStep {
  std::function<void()> apply;
  std::function<void()> undo;
};

/// One tracked object as the manager sees it, whatever its type.
struct CheckpointTrackable {
  /// "variable", "optimizer", "iterator": for messages.
  std::string kind;
  /// Adds the object's tensors to `out`. Every worker calls it, in the same order (it may join
  /// collectives: sharded slots, iterator states).
  std::function<void(checkpoint::TensorMap& out)> save;
  /// Checks that `ckpt` has every tensor the object needs, with its dtype and shape, and adds their
  /// names to `claimed`. Changes nothing. \throws NotFoundError, InvalidArgumentError.
  std::function<void(const checkpoint::Checkpoint& ckpt, std::set<std::string>& claimed)> check;
  /// After every object's `check` passed: prepares the restore (creates a fresh optimizer's slots,
  /// copies every value to its devices) and returns what installs it.
  std::function<CheckpointRestoreStep(const checkpoint::Checkpoint& ckpt)> prepare;
};

struct CheckpointManagerAccess;

}  // namespace mirrored::detail

namespace mirrored::checkpoint {

/// Options of `CheckpointManager`.
struct CheckpointManagerOptions {
  /// What `restore_or_initialize` does when the newest checkpoint is corrupt or truncated (its
  /// load fails with InvalidArgumentError). False (default): throws that error, which names the
  /// file. True: logs a warning naming it and restores the newest checkpoint that loads.
  bool fall_back_to_valid_checkpoint = false;
  /// Whether a save also fsyncs the directory once its files are renamed into place. The data file
  /// is always fsynced before its rename, so under no crash does a partial file carry a
  /// checkpoint's name. True: a checkpoint survives a machine crash (power loss) as soon as `save`
  /// returns. False (default, as TF's manager, which syncs nothing): one fsync per save instead of
  /// two; a machine crash soon after a save may undo its renames (and a later deletion) -- on a
  /// journaling file system (ext4, XFS) in order, so the directory then shows an earlier,
  /// consistent state, whose newest checkpoint restores. A process crash loses nothing either way.
  bool sync_directory = false;
};

/// Options of `CheckpointManager::restore_or_initialize`.
struct RestoreOptions {
  /// TF's `expect_partial()` (`checkpoint.restore(path).expect_partial()`): restoring only part of
  /// the checkpoint is intended -- the weights without the optimizer's slots and step counter or
  /// the iterators' states, to evaluate or fine-tune a model. The checkpoint's tensors that
  /// nothing tracked here asks for are then left alone (`CheckpointManager::unrestored` lists
  /// them) instead of failing the restore. Every tracked object must still find all its tensors.
  bool expect_partial = false;
};

/// Saves and restores tracked state as numbered checkpoints in a directory (see the file comment).
/// Not copyable or movable (its tracked objects' callbacks refer to it).
class CheckpointManager {
 public:
  /// Keeps the newest `max_to_keep` checkpoints of `directory` (created by the first save if
  /// missing). Touches no file. \throws InvalidArgumentError for an empty directory name or
  /// `max_to_keep` < 1.
  CheckpointManager(Strategy& strategy, std::string directory, int max_to_keep = 5,
                    CheckpointManagerOptions options = {});
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  /// Tracks `v` under `name` (its tensor's name in the file). \throws InvalidArgumentError for an
  /// empty name, a name already tracked, or a variable already tracked under another name.
  template <class T>
  void track(const std::string& name, Variable<T>& v);
  /// Tracks `o`'s slots and step counter under `name`. Its slots must belong to variables tracked
  /// by this manager (checked when saving). On restore an optimizer that has not made its slots yet
  /// (no `apply_gradients` or `build` so far) makes them, in the strategy's scope, for every tracked
  /// variable the checkpoint has slots of. \throws InvalidArgumentError as the variable overload.
  template <class T>
  void track(const std::string& name, optimizers::Optimizer<T>& o);
  /// Tracks `it`'s position (each worker's `save_state()`; restored with `restore_state` of every
  /// saved worker's state, so a checkpoint of another number of workers or replicas restores
  /// where the iterator can resume there: see `DistributedIterator::restore_state`).
  /// \throws InvalidArgumentError as the variable overload.
  template <class E>
  void track(const std::string& name, DistributedIterator<E>& it);

  /// Sets user metadata, saved with every later checkpoint (the file's `__metadata__`) and
  /// replaced by a checkpoint's on restore (epoch, step, RNG seeds, ...). \throws
  /// InvalidArgumentError for an empty key or one starting with `mirrored.` (the library's).
  void set_metadata(const std::string& key, std::string value);
  /// The metadata value of `key` (set, or restored), if any.
  std::optional<std::string> metadata(const std::string& key) const;

  /// Saves everything tracked as checkpoint `step` and returns its path
  /// (`DIR/ckpt-<step>.safetensors`; the same on every worker; saving a step again replaces it).
  /// Any step from 0 to INT64_MAX (a timestamp in nanoseconds, say) is found again by
  /// `latest_checkpoint` and the directory scan.
  /// Every worker must call it (see the file comment). Nothing tracked changes.
  /// \throws InvalidArgumentError for a negative step, two tracked objects that store the same
  /// tensor name, or optimizer slots of an untracked variable (naming them); FailedPreconditionError
  /// inside `run` or while another save to the directory runs; the errors of `save_tensors` (on
  /// the chief; other workers get UnavailableError naming the chief's failure). On any error the
  /// previous checkpoints and the index are unchanged.
  std::string save(int64_t step);

  /// The newest checkpoint's path (see the file comment), or nullopt when the directory is
  /// missing or holds none. \throws InvalidArgumentError when the directory's path names something
  /// that is not a directory; PermissionDeniedError when it cannot be read.
  std::optional<std::string> latest_checkpoint() const;

  /// Restores everything tracked from the newest checkpoint and returns its step, or returns
  /// nullopt and changes nothing when there is none (an empty or missing directory: initialise).
  /// The whole file is loaded and checked first -- every tracked tensor present with its dtype and
  /// shape, no tensor that nothing tracked here stores (unless `options.expect_partial`), each
  /// iterator saved by as many workers as this run has, or resumable on this run's placement
  /// (`DistributedIterator::restore_state` of every worker's state) -- and only then is anything
  /// changed.
  /// \throws InvalidArgumentError for a corrupt newest checkpoint (unless
  /// `fall_back_to_valid_checkpoint`), a checkpoint of another model (other dtypes or shapes, extra
  /// names: the message lists them and names `expect_partial`), or an iterator state its
  /// `restore_state` refuses (another placement for an iterator that cannot resume there); NotFoundError for a tensor
  /// the checkpoint lacks; FailedPreconditionError inside `run`. Every message names the file. On any error nothing
  /// tracked has changed (except that an optimizer may have made its slots, zeros, as its first update would), nor has
  /// `unrestored()`.
  std::optional<int64_t> restore_or_initialize(RestoreOptions options = {});

  /// The names of the tensors of the checkpoint the last successful `restore_or_initialize`
  /// restored that nothing tracked here asked for, in file (name) order: what
  /// `RestoreOptions::expect_partial` left alone. Empty before any restore, after one that found no
  /// checkpoint, and after one that restored every tensor.
  const std::vector<std::string>& unrestored() const noexcept { return unrestored_; }

  const std::string& directory() const noexcept { return directory_; }
  int max_to_keep() const noexcept { return max_to_keep_; }

 private:
  friend struct detail::CheckpointManagerAccess;

  struct TrackedVariable {
    const void* state;  // VariableAccess::state of the variable: how optimizers key their slots
    std::any handle;    // the Variable<T>
  };

  void add(const std::string& name, detail::CheckpointTrackable t);
  void add_variable(const std::string& name, const void* state, std::any handle, detail::CheckpointTrackable t);
  /// A generic per-worker state: `save_fn()` gives this worker's bytes, `restore_fn(bytes)` installs
  /// them (and may throw InvalidArgumentError for a state it refuses). Without `restore_all` a
  /// checkpoint saved by another number of workers is refused; with it, `restore_all(states)`
  /// gets every saved worker's bytes (worker k's at index k) and decides (`restore_fn` then only
  /// puts back the state of before when another object's restore fails).
  void track_state(const std::string& name, std::function<std::string()> save_fn,
                   std::function<void(const std::string&)> restore_fn,
                   std::function<void(const std::vector<std::string>&)> restore_all = {});
  /// The name `name` of variable state `state` is tracked under, or nullptr.
  const std::string* tracked_variable_name(const void* state) const;
  /// Adds `t` to `out` as `name`. \throws InvalidArgumentError when `out` already has `name`
  /// (two tracked objects store the same tensor name).
  static void add_tensor(TensorMap& out, const std::string& name, detail::UntypedTensor t, const std::string& owner);
  [[noreturn]] static void throw_untracked_slot(const std::string& optimizer, const std::string& slot_variable,
                                                const char* op);

  /// The chief's part of `save(step)`: under the directory's lock, writes the data file and the
  /// index, then drops what the index no longer keeps.
  void write_checkpoint(int64_t step, const TensorMap& tensors, const std::string& who);
  /// The directory, opened (and created) by the first save of the chief: what a save locks.
  /// Reopened when the directory at `directory_` is no longer the one it refers to.
  int directory_fd(const std::string& who);

  Strategy& strategy_;
  std::string directory_;
  int max_to_keep_;
  CheckpointManagerOptions options_;
  int dir_fd_ = -1;
  // The spares (names in directory_) the next save writes its data file and its index into, or
  // empty.
  std::string spare_;
  std::string index_spare_;
  std::map<std::string, detail::CheckpointTrackable> tracked_;  // saved and restored in name order
  std::map<std::string, TrackedVariable> variables_;
  Metadata metadata_;
  std::vector<std::string> unrestored_;
};

// ---------------------------------------------------------------------------------------------
// `track` of a variable is compiled for every element type, of an optimizer for float and double
// (src/variables/checkpoint_tracking.cpp); that of an iterator hands its state on as bytes.

template <class E>
void CheckpointManager::track(const std::string& name, DistributedIterator<E>& it) {
  track_state(
      name, [&it] { return it.save_state(); }, [&it](const std::string& state) { it.restore_state(state); },
      [&it](const std::vector<std::string>& states) { it.restore_state(states); });
}

}  // namespace mirrored::checkpoint

namespace mirrored::detail {

/// Test hook: `CheckpointManager::track_state`, the type-erased path of iterators.
struct CheckpointManagerAccess {
  static void track_state(checkpoint::CheckpointManager& m, const std::string& name,
                          std::function<std::string()> save_fn, std::function<void(const std::string&)> restore_fn) {
    m.track_state(name, std::move(save_fn), std::move(restore_fn));
  }
};

}  // namespace mirrored::detail
