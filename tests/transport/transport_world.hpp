#pragma once
// Test helper: the workers of a job as threads of the test process, each with its own
// WorkerTransport of one kind — Gloo over TCP on 127.0.0.1, or shared memory — met through a file
// store in a directory of the test's. Both transports rendezvous through the store alone, so the
// same tests run against either, as the cross-worker half of every collective sees them.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/store/store.hpp"
#include "cluster/transport/gloo/gloo_transport.hpp"
#include "cluster/transport/peers.hpp"
#include "cluster/transport/shm/shm_transport.hpp"
#include "cluster/transport/transport.hpp"

namespace mirrored::testing {

enum class TransportKind { gloo, shm };

inline const char* transport_kind_name(TransportKind kind) { return kind == TransportKind::gloo ? "Gloo" : "Shm"; }

/// What worker `rank` tells the others when it joins: one host and one IPC namespace, so that
/// the shared-memory transport applies. `pid` 0 turns off its liveness checks of the peers
/// (threads of one process share a pid); a forked worker passes its own.
inline detail::cluster::WorkerInfo same_host_info(long pid = 0) {
  detail::cluster::WorkerInfo info;
  info.hostname = "localhost";
  info.boot_id = "test-boot";
  info.ipc_namespace = "test-ipc";
  info.pid_namespace = pid > 0 ? "test-pid" : "";
  info.local_replicas = 1;
  info.device_kind = "CPU";
  info.pid = pid;
  return info;
}

/// Worker `rank`'s transport of `kind` for a job of `infos.size()` workers, met under `prefix` in
/// `store`. nullptr when the shared-memory transport declined (it says why in the log).
inline std::unique_ptr<detail::cluster::WorkerTransport> make_transport(
    TransportKind kind, detail::cluster::KeyValueStore& store, const std::string& prefix, int rank,
    const std::vector<detail::cluster::WorkerInfo>& infos, std::chrono::steady_clock::time_point deadline) {
  if (kind == TransportKind::gloo)
    return detail::cluster::make_gloo_transport(store, prefix, "127.0.0.1", rank, static_cast<int>(infos.size()),
                                                deadline);
  std::vector<std::string> names;
  for (std::size_t w = 0; w < infos.size(); ++w) names.push_back("worker " + std::to_string(w));
  const detail::cluster::TransportJob job{store, prefix, rank, infos, names};
  return detail::cluster::make_shm_transport_if_same_host(job, deadline);
}

/// A job prefix no other world of this process (or of another test process) uses: the shared
/// memory segment is named after it.
inline std::string fresh_prefix() {
  static std::atomic<int> counter{0};
  return "transport-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "/";
}

/// Runs `fn(rank)` on one thread per worker and joins them all; rethrows the first exception of
/// the lowest rank. Every transport operation ends by its deadline, so the join is bounded.
inline void on_every_worker(int workers, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      try {
        fn(w);
      } catch (...) {
        errors[static_cast<std::size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// A job of `workers` threads, each with its transport of `kind`, set up at construction.
class TransportWorld {
 public:
  TransportWorld(TransportKind kind, const std::string& store_dir, int workers)
      : prefix_(fresh_prefix()), infos_(static_cast<std::size_t>(workers), same_host_info()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int w = 0; w < workers; ++w) stores_.push_back(detail::cluster::make_file_store(store_dir));
    transports_.resize(static_cast<std::size_t>(workers));
    on_every_worker(workers, [&](int w) {
      transports_[static_cast<std::size_t>(w)] =
          make_transport(kind, *stores_[static_cast<std::size_t>(w)], prefix_, w, infos_, deadline);
    });
  }

  int size() const { return static_cast<int>(transports_.size()); }
  /// Worker `rank`'s transport (null if it declined: the caller asserts).
  detail::cluster::WorkerTransport* operator[](int rank) const {
    return transports_[static_cast<std::size_t>(rank)].get();
  }
  /// Worker `rank`'s transport goes away (its connections close, its mapping ends).
  void drop(int rank) { transports_[static_cast<std::size_t>(rank)].reset(); }

 private:
  std::string prefix_;
  std::vector<detail::cluster::WorkerInfo> infos_;
  std::vector<std::unique_ptr<detail::cluster::KeyValueStore>> stores_;
  std::vector<std::unique_ptr<detail::cluster::WorkerTransport>> transports_;
};

}  // namespace mirrored::testing
