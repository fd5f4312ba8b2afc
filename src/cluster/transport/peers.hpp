#pragma once
// Private: the workers of a job as a transport sees them — what each told the others when it
// joined (the coordinator gathers these through the job's store) and how messages name it.

#include <string>
#include <vector>

#include "cluster/store/store.hpp"

namespace mirrored::detail::cluster {

/// What a worker tells the others when it joins.
struct WorkerInfo {
  std::string hostname;
  std::string boot_id;        // the kernel instance (same host)
  std::string ipc_namespace;  // same host *and* same shared-memory namespace
  std::string pid_namespace;  // pids comparable (liveness checks of same-host peers)
  int local_replicas = 0;
  std::string device_kind;  // "CPU" or "GPU"
  long pid = 0;
  std::string heartbeat_host;             // where its ring-neighbour heartbeats are received
  int heartbeat_port = 0;                 // their UDP port (0: none)
  std::vector<std::string> default_gpus;  // its machine's names of the GPUs it took by default
  /// Where this worker can share memory: its kernel instance and IPC namespace ("" when it did
  /// not publish them: it shares memory with nobody). Workers with the same non-empty domain map
  /// one segment.
  std::string shared_memory_domain() const {
    return boot_id.empty() || ipc_namespace.empty() ? std::string() : boot_id + "/" + ipc_namespace;
  }
  std::string encode() const;
  static WorkerInfo decode(const std::string& text);
};

/// The job a transport is made for, as the coordinator knows it once every worker has joined.
struct TransportJob {
  KeyValueStore& store;                    ///< the job's store
  const std::string& prefix;               ///< keys of this job attempt start with this
  int rank = 0;                            ///< this worker
  const std::vector<WorkerInfo>& workers;  ///< every worker, by rank
  const std::vector<std::string>& names;   ///< "worker 1 (10.0.0.2:2222)", by rank
  int num_workers() const noexcept { return static_cast<int>(workers.size()); }
};

}  // namespace mirrored::detail::cluster
