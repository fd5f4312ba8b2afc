#pragma once
// Private: one worker's membership of a multi-worker job. At construction it meets the other
// workers through the job's store (the chief's TCP store, or a `file:` store) and connects the
// transport; while it lives it watches for failures; at destruction it says goodbye and waits
// until every other worker has left too (so that nobody tears down a connection another worker
// still uses).
//
// Failures (docs/multi_worker.md): the first failure of a job is published in the store, so
// every worker reports the same cause — UnavailableError naming a worker that died,
// DeadlineExceededError after the collective timeout (naming workers that stopped answering),
// FailedPreconditionError naming a worker that left early. Failures that close no connection (a
// host down or partitioned, a process stopped) are found by heartbeats within the peer timeout
// (MIRRORED_PEER_TIMEOUT_S, 10 s): the chief's store hears every worker's monitor, every monitor
// hears the store, and ring neighbours hear each other (peer_watch.hpp); see docs/reliability.md. The worker that sees
// it fails the collective in flight with it (interrupting the transport), and every later collective fails with
// FailedPreconditionError: a job is restarted to recover, as in TF.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/coordinator/peer_watch.hpp"
#include "cluster/resolvers/tf_config.hpp"
#include "cluster/store/store.hpp"
#include "cluster/transport/peers.hpp"
#include "cluster/transport/transport.hpp"
#include "mirrored/deadline.hpp"

namespace mirrored::detail {
class FlightRecorder;
}  // namespace mirrored::detail

namespace mirrored::detail::cluster {

class StoreServer;
class TcpStoreClient;

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  /// Joins the job described by `layout` (which must have at least two workers), waiting up to
  /// `timeout_s` for every worker. \throws DeadlineExceededError naming the workers that never
  /// joined; InvalidArgumentError when workers disagree on their number of replicas; what the
  /// store or transport throws. `default_gpus`: the machine's names of the GPUs this worker took
  /// by default, told to the others when it joins (`WorkerInfo::default_gpus`).
  Coordinator(const ClusterLayout& layout, double timeout_s, int local_replicas, std::string device_kind,
              bool allow_shared_memory, std::vector<std::string> default_gpus = {});

  /// Makes the cross-worker transport once every worker has joined, by `deadline`.
  using TransportFactory = std::function<std::unique_ptr<WorkerTransport>(const TransportJob&, Clock::time_point)>;
  /// Joins as above, through `store` (watched by polling, as a `file:` store is) whose keys of
  /// this attempt start with the job id, then `generation`; `make_transport` connects the
  /// workers. The seam for tests, whose doubles make the store or the transport fail.
  Coordinator(const ClusterLayout& layout, double timeout_s, int local_replicas, std::string device_kind,
              std::unique_ptr<KeyValueStore> store, const std::string& generation,
              const TransportFactory& make_transport);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int num_workers() const noexcept { return layout_.num_workers; }
  int rank() const noexcept { return layout_.rank; }
  /// "worker 1 (10.0.0.2:2222)" for rank `w`.
  const std::string& name(int w) const { return layout_.names[static_cast<std::size_t>(w)]; }
  const std::vector<WorkerInfo>& workers() const noexcept { return infos_; }
  WorkerTransport& transport() noexcept { return *transport_; }
  KeyValueStore& store() noexcept { return *store_; }
  /// Keys of this job attempt start with this (job id and generation).
  const std::string& prefix() const noexcept { return prefix_; }

  /// Runs one cross-worker collective: `body(deadline)` moves the bytes through the transport, by
  /// the call's `deadline` (never a new one).
  /// \throws FailedPreconditionError when the job failed earlier (or a worker left before this
  /// collective); on a failure inside `body`, the job's first failure with its type.
  void collective(const char* what, const mirrored::Deadline& deadline,
                  const std::function<void(Clock::time_point)>& body);

  /// Number of collectives made so far.
  int64_t collectives() const noexcept { return seq_.load(); }

  /// Also called (from any thread, once) when the job fails, after the transport is interrupted:
  /// for other communication that must stop too (the NCCL communicators). Set before use.
  void on_failure(std::function<void()> fn) {
    std::lock_guard lock(mu_);
    on_failure_ = std::move(fn);
  }
  /// Fails the job from outside a `collective` (a failure of the GPU path): publishes `notice`
  /// unless another failure came first, and returns the job's failure.
  FailureNotice fail(FailureNotice notice);
  /// The local replicas' flight recorder (set once, before any collective).
  void set_recorder(FlightRecorder& recorder) noexcept { recorder_.store(&recorder); }
  /// "flight recorder: worker 1 replica 0 (CPU:0) last completed all_reduce #17 and has not
  /// entered #18 for 10.0 s; every other replica waits in all_reduce #18": this worker posts its
  /// replicas' state to the job's store and reads every other worker's, waiting up to `wait_s` in
  /// all (a worker that posted nothing by then is named as silent: stopped, hung or gone). Also
  /// dumps the rings when MIRRORED_FLIGHT_RECORDER_DIR is set. "" without a recorder; never throws.
  std::string flight_report(double wait_s) noexcept;
  /// Posts this worker's replicas' state for the others' reports (once the job failed).
  void post_flight_state() noexcept;

  /// The job's failure as this worker knows it, if any.
  std::optional<FailureNotice> failure() {
    std::lock_guard lock(mu_);
    return failure_;
  }

 private:
  void start_store(double timeout_s);
  void start_server(const std::string& host, int port, double timeout_s);
  // Waits for `keys` (the workers' joins) until `deadline`; returns those missing. \throws
  // InvalidArgumentError when the store has a start-up error (workers configured differently).
  // "worker 1 (…), worker 2 (…)": the workers of join keys ("…/join/<rank>").
  std::string name_joins(const std::vector<std::string>& join_keys) const;
  std::vector<std::string> wait_for_workers(const std::vector<std::string>& keys, Clock::time_point deadline);
  // Meets the other workers through store_ and connects them with `make_transport`; then watches.
  void join(Clock::time_point deadline, int local_replicas, const std::string& device_kind,
            const TransportFactory& make_transport);
  void meet(Clock::time_point deadline, int local_replicas, const std::string& device_kind);
  void monitor_loop();
  // Starts the ring-neighbour heartbeats (TCP store only: the pair check asks the chief).
  void start_peer_watch();
  // A ring neighbour went silent (monitor thread): publishes it as lost (the chief no longer
  // hears it either) or the pair as unable to reach each other, and fails this worker; true
  // then. \throws what the monitor's store throws (the chief does not answer this worker).
  bool neighbour_silent(int w);
  // Warns once per collective that has been in flight for MIRRORED_STALL_WARN_S.
  void warn_if_stalled();
  // Records `notice` as this worker's failure (first one wins) and interrupts the transport.
  void fail_locally(const FailureNotice& notice);
  [[noreturn]] void fail_collective(const char* what, Clock::time_point deadline, double timeout_s,
                                    const TransportError& error);
  std::optional<FailureNotice> published_failure(double wait_s);
  // After a transport failure: the job's failure as the monitor finds it (published by anyone, or
  // the chief's loss), or nullopt once the monitor has polled the chief's store twice and found
  // none; bounded by the peer timeout.
  std::optional<FailureNotice> monitor_verdict();
  std::string describe_stale();
  void shutdown() noexcept;

  ClusterLayout layout_;
  std::vector<std::string> default_gpus_;  // told to the others when joining
  double timeout_s_;
  double peer_timeout_s_;  // MIRRORED_PEER_TIMEOUT_S: a silent worker or pair is a failure after this
  double stall_warn_s_;    // MIRRORED_STALL_WARN_S
  std::string job_id_;
  std::string prefix_;
  std::vector<WorkerInfo> infos_;
  std::unique_ptr<StoreServer> server_;  // on the chief, with the TCP store
  TcpStoreClient* tcp_ = nullptr;        // store_ when it is the TCP store
  std::unique_ptr<KeyValueStore> store_;
  std::unique_ptr<TcpStoreClient> monitor_store_;
  std::unique_ptr<WorkerTransport> transport_;

  std::atomic<FlightRecorder*> recorder_{nullptr};
  std::atomic<int64_t> seq_{0};
  std::atomic<int64_t> in_flight_{0};  // the collective in progress (0: none)
  std::atomic<const char*> in_flight_what_{""};
  std::unique_ptr<PeerWatch> peer_watch_;
  std::atomic<bool> store_lost_{false};    // the chief's store stopped answering
  std::atomic<int> silent_neighbour_{-1};  // a ring neighbour the peer watch found silent
  // The monitor thread's view of the collective in flight, for the stall warning.
  int64_t stall_seq_ = 0;
  Clock::time_point stall_since_;
  bool stall_warned_ = false;

  std::mutex mu_;
  std::condition_variable stop_cv_;
  std::condition_variable poll_cv_;  // a monitor poll completed, or the job failed
  int64_t polls_ = 0;                // monitor polls completed without a failure
  bool stopping_ = false;
  std::optional<FailureNotice> failure_;           // this worker's view of the job's first failure
  bool failure_reported_ = false;                  // a collective already threw it
  std::vector<std::pair<int, int64_t>> departed_;  // (rank, collectives) of workers that left
  std::function<void()> on_failure_;
  std::thread monitor_;
};

/// Throws the error a failure notice describes.
[[noreturn]] void throw_failure(const FailureNotice& notice);

}  // namespace mirrored::detail::cluster
