#pragma once
// Private: the transport of a job whose hosts run several workers each — shared memory among the
// workers of one host, Gloo over TCP between the hosts' leaders (each host's lowest rank), so that
// a remote worker no longer puts the workers of one host on loopback TCP. A collective runs in
// three steps: within each host, between the leaders, and back within each host.

#include <chrono>
#include <memory>
#include <string>

#include "cluster/transport/peers.hpp"
#include "cluster/transport/transport.hpp"

namespace mirrored::detail::cluster {

/// The two-level transport when the job's workers are on more than one host (by kernel instance
/// and IPC namespace, as the shared-memory transport decides) and some host has more than one,
/// and `MIRRORED_SHARED_MEMORY` is not 0/off; nullptr otherwise (every worker decides the same
/// way, from what every worker published). `host` is this worker's address for Gloo.
/// \throws UnavailableError when a host's workers cannot share memory (MIRRORED_SHARED_MEMORY=0
/// puts every worker on TCP); what the Gloo transport throws.
std::unique_ptr<WorkerTransport> make_two_level_transport_if_grouped(const TransportJob& job, const std::string& host,
                                                                     std::chrono::steady_clock::time_point deadline);

}  // namespace mirrored::detail::cluster
