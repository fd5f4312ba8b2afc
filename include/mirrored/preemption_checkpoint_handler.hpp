#pragma once
/// \file
/// `PreemptionCheckpointHandler` (TF's `tf.distribute.experimental.PreemptionCheckpointHandler`):
/// wraps the training step so that a preempted or terminated job saves where it stands and exits
/// with a status that means "restart me" (docs/fault_tolerance.md has the whole contract).
///
/// - Construction restores the newest checkpoint of the manager (`restore_or_initialize`), and
///   `total_run_calls()` continues from the step it was saved at.
/// - `run(fn, args...)` runs one step (`Strategy::run`) and counts it. After the step, when this
///   process received SIGTERM or `request_preemption()` was called, every worker agrees to save at
///   this step: the manager saves it (every worker joins; the chief writes) and the process exits
///   with `kRestartExitCode`. Across workers the agreement is a one-number sum over all replicas
///   after every step, so all workers stop after the same step, whichever of them was signalled.
/// - Every `save_every_steps` steps (0: never) it also saves, which covers SIGKILL and crashes:
///   the restart resumes from the newest periodic save.

#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

#include "mirrored/strategy.hpp"

namespace mirrored {

namespace checkpoint {
class CheckpointManager;
}

class PreemptionCheckpointHandler {
 public:
  /// The exit status of a process that saved because it was preempted: 75 (`EX_TEMPFAIL`, "a
  /// temporary failure; try again"). `tools/launch.sh --max-restarts K` restarts the job on it.
  static constexpr int kRestartExitCode = 75;

  /// Restores `manager`'s newest checkpoint (if any; see `CheckpointManager::restore_or_initialize`)
  /// and starts watching for SIGTERM, until destroyed (then the previous SIGTERM disposition is back).
  /// Every worker of a multi-worker job makes one, in the same order as its other collectives.
  /// \throws InvalidArgumentError when `save_every_steps < 0`; what `restore_or_initialize` throws.
  PreemptionCheckpointHandler(Strategy& strategy, checkpoint::CheckpointManager& manager, int64_t save_every_steps = 0);
  ~PreemptionCheckpointHandler();
  PreemptionCheckpointHandler(const PreemptionCheckpointHandler&) = delete;
  PreemptionCheckpointHandler& operator=(const PreemptionCheckpointHandler&) = delete;

  /// One training step: `strategy.run(fn, args...)`, then the preemption check and the periodic
  /// save described in the file comment. Returns what `Strategy::run` returns.
  /// \throws what `Strategy::run` throws (the step is then not counted);
  /// FailedPreconditionError after a preemption save when `exit_fn` returned.
  template <class Fn, class... Args>
  auto run(Fn&& fn, Args&&... args) {
    before_step();
    if constexpr (std::is_void_v<decltype(strategy_.run(std::forward<Fn>(fn), std::forward<Args>(args)...))>) {
      strategy_.run(std::forward<Fn>(fn), std::forward<Args>(args)...);
      after_step();
    } else {
      auto result = strategy_.run(std::forward<Fn>(fn), std::forward<Args>(args)...);
      after_step();
      return result;
    }
  }

  /// Steps run so far, those of earlier runs of the job included (restored with the checkpoint).
  int64_t total_run_calls() const noexcept { return total_run_calls_; }
  /// Asks for what SIGTERM does: save after the current (or next) step and exit. Thread-safe.
  void request_preemption() noexcept;
  /// True once this process has been asked to stop (SIGTERM or `request_preemption`).
  bool preemption_requested() const noexcept;

  /// What ends the process after the preemption save; it is given `kRestartExitCode`. The default
  /// flushes stdout and stderr and calls `std::_Exit`: the checkpoint is already on disk, and
  /// destructors of a job that is mid-training (replica threads, peers) are not worth waiting for.
  /// Tests and embedders replace it; if it returns, `run` refuses further steps.
  std::function<void(int)> exit_fn;

 private:
  void before_step() const;
  void after_step();
  bool agree_to_stop(bool local) const;

  Strategy& strategy_;
  checkpoint::CheckpointManager& manager_;
  int64_t save_every_steps_;
  int64_t total_run_calls_ = 0;
  bool stopped_ = false;
};

}  // namespace mirrored
