#pragma once
// Private: the Gloo (TCP) transport between workers. Gloo's headers stay in gloo_transport.cpp.

#include <chrono>
#include <memory>
#include <string>

#include "cluster/store/store.hpp"
#include "cluster/transport/transport.hpp"

namespace mirrored::detail::cluster {

/// Connects every pair of the job's `size` workers with Gloo's TCP transport (this worker listens
/// on `host`, its address from the cluster spec), exchanging addresses under `prefix` in `store`.
/// \throws DeadlineExceededError when a worker's address does not appear by `deadline`;
/// UnavailableError when the connections fail.
std::unique_ptr<WorkerTransport> make_gloo_transport(KeyValueStore& store, const std::string& prefix,
                                                     const std::string& host, int rank, int size,
                                                     std::chrono::steady_clock::time_point deadline);

}  // namespace mirrored::detail::cluster
