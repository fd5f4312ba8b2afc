#pragma once
/// \file
/// The strategy an example program's `--strategy` flag names, and the end of its `--timeline`
/// (train_digits, fashion_mnist).

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace examples {

/// "mirrored": a MirroredStrategy over `devices`; "multi_worker": a MultiWorkerMirroredStrategy
/// over the workers of the launcher that started the program (TF_CONFIG as tools/launch.sh sets
/// it, torchrun, mpirun, srun: cluster_resolver_from_environment()), `devices` being each worker's
/// own replicas. \throws what the strategies' constructors throw.
inline std::unique_ptr<mirrored::Strategy> make_strategy(const std::string& name,
                                                         const std::vector<std::string>& devices) {
  if (name == "multi_worker")
    return std::make_unique<mirrored::MultiWorkerMirroredStrategy>(
        mirrored::CommunicationOptions{}, mirrored::cluster_resolver_from_environment(), devices);
  return std::make_unique<mirrored::MirroredStrategy>(devices);
}

/// The exit status of a program that ends with `e` (printed by `program` on stderr first): a
/// worker of a multi-worker job that lost a peer (UNAVAILABLE, DEADLINE_EXCEEDED) exits with
/// status 75, as a preempted one does, so that the launcher restarts the job (which resumes from
/// its checkpoints); any other error with status 1.
inline int exit_status_for(const char* program, const std::string& strategy, const mirrored::Error& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s: %s\n", program, mirrored::error_code_name(e.code()), e.what());
  if (strategy == "multi_worker" &&
      (e.code() == mirrored::ErrorCode::UNAVAILABLE || e.code() == mirrored::ErrorCode::DEADLINE_EXCEEDED)) {
    std::fprintf(stderr,
                 "%s: a worker of the job was lost; exiting with status %d so that the launcher restarts the job\n",
                 program, mirrored::PreemptionCheckpointHandler::kRestartExitCode);
    return mirrored::PreemptionCheckpointHandler::kRestartExitCode;
  }
  return 1;
}

/// Stops the timeline, if one is recording, and prints where it went ("wrote the timeline to ...").
inline void finish_timeline() {
  if (!mirrored::timeline::active()) return;
  const std::string written = mirrored::timeline::path();
  mirrored::timeline::stop();
  std::printf("wrote the timeline to %s\n", written.c_str());
}

}  // namespace examples
