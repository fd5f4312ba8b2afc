#pragma once
// Private: the cross-worker transport for workers on one host — POSIX shared memory instead of
// loopback TCP. One segment per job attempt, named from the job's id and generation, created
// exclusively by the chief (O_EXCL | O_NOFOLLOW, space reserved up front so that a small
// /dev/shm is an error at start-up, never a SIGBUS later) and unlinked as soon as every worker
// has mapped it, so that nothing is left behind even if the job is killed. Workers copy their
// data into their own slot (rounded to halves for all_reduce_half), then each reduces its slice
// across all slots in worker order (the same sum on every run), then every worker copies the
// result out; barriers are futexes in the
// segment, each wait bounded by the collective's deadline, released at once when the job fails,
// and watching whether the peers' processes still exist.

#include <chrono>
#include <memory>

#include "cluster/transport/peers.hpp"
#include "cluster/transport/transport.hpp"

namespace mirrored::detail::cluster {

/// True when `MIRRORED_SHARED_MEMORY` is 0, off, false or no (every worker on TCP).
bool shared_memory_disabled();

/// The shared-memory transport when every worker of `job` runs on this host in the same
/// shared-memory (IPC) namespace and `MIRRORED_SHARED_MEMORY` is not 0/off; nullptr otherwise
/// (every worker decides the same way: the decision is agreed through the job's store, and a
/// worker that cannot map the segment makes all of them fall back).
std::unique_ptr<WorkerTransport> make_shm_transport_if_same_host(const TransportJob& job,
                                                                 std::chrono::steady_clock::time_point deadline);

}  // namespace mirrored::detail::cluster
