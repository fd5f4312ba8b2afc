#include "mirrored/preemption_checkpoint_handler.hpp"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "mirrored/checkpoint_manager.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored {
namespace {

// Set by the SIGTERM handler (an atomic store is all a signal handler may do) or by
// request_preemption; read after every step.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGTERM handler needs a lock-free flag");

extern "C" void on_sigterm(int) { g_stop_requested.store(true, std::memory_order_relaxed); }

// Handlers may nest (one per strategy); the first installs the SIGTERM handler, the last one
// destroyed puts the previous disposition back.
std::mutex g_install_mu;
int g_installed = 0;
struct sigaction g_previous {};

void install_sigterm_handler() {
  std::lock_guard lock(g_install_mu);
  if (g_installed++ > 0) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or wait the signal lands in goes on; the flag is seen after the step
  if (sigaction(SIGTERM, &sa, &g_previous) != 0) {
    --g_installed;
    throw InternalError("PreemptionCheckpointHandler: cannot install a SIGTERM handler");
  }
}

void uninstall_sigterm_handler() noexcept {
  std::lock_guard lock(g_install_mu);
  if (--g_installed > 0) return;
  sigaction(SIGTERM, &g_previous, nullptr);
}

void flush_and_exit(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

PreemptionCheckpointHandler::PreemptionCheckpointHandler(Strategy& strategy, checkpoint::CheckpointManager& manager,
                                                         int64_t save_every_steps)
    : exit_fn(flush_and_exit), strategy_(strategy), manager_(manager), save_every_steps_(save_every_steps) {
  MIRRORED_ENFORCE(save_every_steps >= 0, InvalidArgumentError,
                   "PreemptionCheckpointHandler: save_every_steps must be >= 0 (0: no periodic saves), got ",
                   save_every_steps);
  // Watch before restoring: a SIGTERM that arrives during a long restore is kept for the first step.
  install_sigterm_handler();
  try {
    total_run_calls_ = manager_.restore_or_initialize().value_or(0);
  } catch (...) {
    uninstall_sigterm_handler();
    throw;
  }
  if (total_run_calls_ > 0)
    MIRRORED_LOG(info, "PreemptionCheckpointHandler: resumed at step ", total_run_calls_, " from ",
                 manager_.latest_checkpoint().value_or("?"));
}

PreemptionCheckpointHandler::~PreemptionCheckpointHandler() { uninstall_sigterm_handler(); }

void PreemptionCheckpointHandler::request_preemption() noexcept {
  g_stop_requested.store(true, std::memory_order_relaxed);
}

bool PreemptionCheckpointHandler::preemption_requested() const noexcept {
  return g_stop_requested.load(std::memory_order_relaxed);
}

void PreemptionCheckpointHandler::before_step() const {
  MIRRORED_ENFORCE(!stopped_, FailedPreconditionError, "PreemptionCheckpointHandler.run: the job was preempted and ",
                   "saved at step ", total_run_calls_, "; restart it to continue");
}

bool PreemptionCheckpointHandler::agree_to_stop(bool local) const {
  // One worker: its replicas are threads of this process and all see the same flag.
  if (strategy_.extended().num_workers() == 1) return local;
  // Several: a sum over every replica of every worker, so that all stop after the same step.
  const std::size_t replicas = strategy_.extended().worker_devices().size();
  const PerReplica<int32_t> flags(std::vector<int32_t>(replicas, local ? 1 : 0));
  return strategy_.reduce(ReduceOp::SUM, flags, std::nullopt) > 0;
}

void PreemptionCheckpointHandler::after_step() {
  ++total_run_calls_;
  if (agree_to_stop(preemption_requested())) {
    const std::string path = manager_.save(total_run_calls_);
    MIRRORED_LOG(warn, "PreemptionCheckpointHandler: preempted; saved step ", total_run_calls_, " to ", path,
                 "; exiting with status ", kRestartExitCode, " (restart the job to resume)");
    stopped_ = true;
    g_stop_requested.store(false, std::memory_order_relaxed);  // this request is answered
    if (exit_fn) exit_fn(kRestartExitCode);
    return;
  }
  if (save_every_steps_ > 0 && total_run_calls_ % save_every_steps_ == 0) manager_.save(total_run_calls_);
}

}  // namespace mirrored
