#pragma once
// Private: the chief's key/value store over TCP (c10d's TCPStore has this role in PyTorch; Gloo
// ships none). The chief runs a `StoreServer` on its TF_CONFIG port; every worker (the chief
// included) talks to it through `TcpStoreClient`s: one for requests, one ("monitor") that
// long-polls the job's failure key. The server knows which worker each monitor connection
// belongs to, so a worker whose process dies (its connections close without a goodbye) is
// published at once as the job's failure, naming it.
//
// Wire format: frames of [u32 length][u8 op or status][fields], strings as [u32 length][bytes],
// integers as i64, native byte order (every worker runs the same build). Malformed or oversized
// frames close the connection.

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cluster/net/socket.hpp"
#include "cluster/store/store.hpp"

namespace mirrored::detail::cluster {

/// The key under which a job publishes its first failure (an encoded FailureNotice).
std::string failure_key(const std::string& prefix);

/// The key under which a job publishes why its start-up failed for every worker (workers
/// configured differently: their TF_CONFIGs' clusters, or two with one task index).
std::string startup_error_key(const std::string& prefix);

/// The server: one thread, serving until destroyed.
class StoreServer {
 public:
  /// Listens on `host:port` (port 0: any free port, see `port()`). `worker_names[k]` names rank k
  /// in failure messages. Keys are stored as given; `prefix` (job id and generation, see
  /// `generation()`) is where the server publishes a dead worker: `failure_key(prefix)`.
  /// A worker whose monitor has joined and then sends nothing for `peer_timeout_s` (its monitor
  /// polls several times a second) is published as lost (`lost_worker_notice`) and its
  /// connections are dropped: a host that vanishes closes no connection.
  /// \throws UnavailableError when the port cannot be bound.
  StoreServer(const std::string& host, int port, std::string job_id, std::vector<std::string> worker_names,
              double peer_timeout_s = kDefaultPeerTimeoutSeconds);
  /// MIRRORED_PEER_TIMEOUT_S's default.
  static constexpr double kDefaultPeerTimeoutSeconds = 10.0;
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const noexcept;
  /// A random id of this server's lifetime: a restarted chief has another, so keys of an
  /// earlier attempt are never read.
  const std::string& generation() const noexcept;
  /// Waits up to `timeout_s` until every worker's connection has closed (so that none of them
  /// loses the store while it still has a request to make); false at the deadline.
  bool wait_until_disconnected(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A connection to the chief's store.
class TcpStoreClient : public KeyValueStore {
 public:
  enum class Role { request, monitor };
  /// Connects (retrying until `connect_timeout_s`: the chief may start later) and introduces
  /// itself as worker `rank` of job `job_id` whose cluster (TF_CONFIG) names its workers
  /// `cluster` (empty: not compared). \throws DeadlineExceededError when the chief cannot be
  /// reached in time; FailedPreconditionError when the store serves another job;
  /// InvalidArgumentError when `cluster` differs from the chief's, or another process already
  /// joined as a monitor of `rank` (both published under startup_error_key for the others).
  /// A request that gets no answer within its own timeout plus `answer_slack_s` fails with
  /// DeadlineExceededError (a monitor's slack is the peer timeout: its silence is the chief's loss).
  TcpStoreClient(const std::string& host, int port, const std::string& job_id, int rank, Role role,
                 double connect_timeout_s, const std::vector<std::string>& cluster = {},
                 double answer_slack_s = kAnswerSlackSeconds);
  ~TcpStoreClient() override;

  /// The server's generation (see StoreServer::generation).
  const std::string& generation() const noexcept { return generation_; }

  void set(const std::string& key, const std::string& value) override;
  bool set_if_absent(const std::string& key, const std::string& value) override;
  std::optional<std::string> get(const std::string& key, double timeout_s) override;
  std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s) override;
  std::string describe() const override { return who_; }

  /// Says goodbye after `collectives` cross-worker collectives: this worker's connections may
  /// now close without that counting as its death.
  void bye(int64_t collectives);
  /// Waits up to `timeout_s` until every worker has said goodbye or died; false at the deadline.
  bool wait_all_gone(double timeout_s);
  /// Workers whose monitor has not polled for `threshold_s` seconds (a stopped or hung process).
  std::vector<int> stale_workers(double threshold_s, double timeout_s);
  /// Workers that said goodbye, with the number of collectives each had made.
  std::vector<std::pair<int, int64_t>> departed(double timeout_s);

  /// Seconds a request may wait for the server beyond its own timeout before it counts as
  /// unanswered.
  static constexpr double kAnswerSlackSeconds = 5.0;

 private:
  std::string request(const std::string& frame, double timeout_s, int* status);

  std::string who_;
  double answer_slack_s_;
  net::Fd fd_;
  std::string generation_;
  std::mutex mu_;              // one request at a time on the connection
  std::exception_ptr broken_;  // the failure that left the connection out of step
};

}  // namespace mirrored::detail::cluster
