#include "cluster/coordinator/coordinator.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "cluster/net/socket.hpp"
#include "cluster/store/tcp_store.hpp"
#include "cluster/transport/gloo/gloo_transport.hpp"
#include "cluster/transport/shm/shm_transport.hpp"
#include "cluster/transport/two_level/two_level_transport.hpp"
#include "collectives/flight_recorder.hpp"
#include "mirrored/errors.hpp"
#include "util/fnv1a.hpp"
#include "util/log.hpp"

namespace mirrored::detail::cluster {
namespace {

// How long a worker whose collective timed out waits for another worker's published cause.
constexpr double kTimeoutCauseWaitSeconds = 0.2;
// After a failure, how long the chief keeps serving the store for the others at most.
constexpr double kFailureLingerSeconds = 10.0;
// How often a worker waiting for the others at start-up looks for a published start-up error.
constexpr double kStartupPollSeconds = 0.2;
// How long a worker 0 that cannot listen on its port looks for the job's store there.
constexpr double kDuplicateProbeSeconds = 2.0;
// After a clean run, how long the chief keeps serving the store until every worker has closed
// its connections (they still wait there for the last goodbye).
constexpr double kGoodbyeLingerSeconds = 10.0;
// How much longer the chief waits for the workers at start-up than they wait for each other.
constexpr double kChiefStartupGraceSeconds = 2.0;
// How long a failing collective waits for the other workers' flight-recorder states (their
// monitors post them as soon as they see the failure): well inside kCollectiveGraceSeconds, with
// the wait for the published cause.
constexpr double kFlightReportWaitSeconds = 0.5;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string read_small_file(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string default_job_id(const ClusterLayout& layout) {
  // Workers of the same cluster agree on it without configuration.
  std::string addresses;
  for (const auto& a : layout.addresses) addresses += a + ",";
  uint64_t h = fnv1a(addresses);
  static const char* hex = "0123456789abcdef";
  std::string out = "job-";
  for (int i = 0; i < 12; ++i, h >>= 4) out += hex[h & 15];
  return out;
}

// "; report", or "" for no report.
std::string with_separator(const std::string& report) { return report.empty() ? report : "; " + report; }

}  // namespace

[[noreturn]] void throw_failure(const FailureNotice& notice) {
  switch (static_cast<ErrorCode>(notice.code)) {
    case ErrorCode::DEADLINE_EXCEEDED: throw DeadlineExceededError(notice.message);
    case ErrorCode::FAILED_PRECONDITION: throw FailedPreconditionError(notice.message);
    case ErrorCode::INVALID_ARGUMENT: throw InvalidArgumentError(notice.message);
    case ErrorCode::ABORTED: throw AbortedError(notice.message);
    default: throw UnavailableError(notice.message);
  }
}

Coordinator::Coordinator(const ClusterLayout& layout, double timeout_s, int local_replicas, std::string device_kind,
                         bool allow_shared_memory, std::vector<std::string> default_gpus)
    : layout_(layout),
      default_gpus_(std::move(default_gpus)),
      timeout_s_(timeout_s),
      peer_timeout_s_(env_positive("MIRRORED_PEER_TIMEOUT_S", StoreServer::kDefaultPeerTimeoutSeconds)),
      stall_warn_s_(stall_warn_seconds()) {
  const auto deadline = net::deadline_after(timeout_s);
  job_id_ = env_or("MIRRORED_JOB_ID", default_job_id(layout_));
  start_store(timeout_s);
  join(deadline, local_replicas, device_kind, [&](const TransportJob& job, Clock::time_point by) {
    if (auto shm = allow_shared_memory ? make_shm_transport_if_same_host(job, by) : nullptr) return shm;
    // A worker without an address in the cluster listens on its address towards the chief.
    const std::string host = layout_.own_host();
    if (auto two = allow_shared_memory ? make_two_level_transport_if_grouped(job, host, by) : nullptr) return two;
    return make_gloo_transport(job.store, job.prefix, host, rank(), num_workers(), by);
  });
}

Coordinator::Coordinator(const ClusterLayout& layout, double timeout_s, int local_replicas, std::string device_kind,
                         std::unique_ptr<KeyValueStore> store, const std::string& generation,
                         const TransportFactory& make_transport)
    : layout_(layout),
      timeout_s_(timeout_s),
      peer_timeout_s_(env_positive("MIRRORED_PEER_TIMEOUT_S", StoreServer::kDefaultPeerTimeoutSeconds)),
      stall_warn_s_(stall_warn_seconds()) {
  const auto deadline = net::deadline_after(timeout_s);
  job_id_ = env_or("MIRRORED_JOB_ID", default_job_id(layout_));
  store_ = std::move(store);
  prefix_ = job_id_ + "/" + generation + "/";
  join(deadline, local_replicas, device_kind, make_transport);
}

void Coordinator::join(Clock::time_point deadline, int local_replicas, const std::string& device_kind,
                       const TransportFactory& make_transport) {
  meet(deadline, local_replicas, device_kind);
  const TransportJob job{
      .store = *store_, .prefix = prefix_, .rank = rank(), .workers = infos_, .names = layout_.names};
  transport_ = make_transport(job, deadline);
  start_peer_watch();
  MIRRORED_LOG(info, "MultiWorkerMirroredStrategy: ", name(rank()), " joined a job of ", num_workers(), " workers (",
               store_->describe(), "; cross-worker transport: ", transport_->name(), ")");
  monitor_ = std::thread([this] { monitor_loop(); });
}

Coordinator::~Coordinator() { shutdown(); }

void Coordinator::start_store(double timeout_s) {
  const std::string spec = env_or("MIRRORED_STORE", "tcp");
  std::string generation;
  if (spec.rfind("file:", 0) == 0) {
    store_ = make_file_store(spec.substr(5));
    // A shared directory outlives a job: a restarted job must use a new generation (Slurm's
    // restart count by default) so that it never reads the keys of an earlier attempt.
    generation = env_or("MIRRORED_JOB_GENERATION", env_or("SLURM_RESTART_COUNT", "0"));
  } else if (spec == "tcp") {
    const auto [host, port] = net::split_host_port(layout_.addresses[0], name(0));
    if (rank() == 0) start_server(host, port, timeout_s);
    std::unique_ptr<TcpStoreClient> client;
    try {
      client = std::make_unique<TcpStoreClient>(host, port, job_id_, rank(), TcpStoreClient::Role::request, timeout_s,
                                                layout_.names);
      // The monitor's polls are its heartbeats: an answer that does not come within the peer
      // timeout is the chief's loss.
      monitor_store_ = std::make_unique<TcpStoreClient>(host, port, job_id_, rank(), TcpStoreClient::Role::monitor,
                                                        timeout_s, layout_.names, peer_timeout_s_);
    } catch (const DeadlineExceededError& e) {
      // e names the chief's address: name(0) would repeat it.
      throw DeadlineExceededError(str_cat("MultiWorkerMirroredStrategy: worker 0, the chief, never joined within ",
                                          timeout_s, " s: ", e.what(),
                                          " (start-up timeout: CommunicationOptions::timeout_seconds or "
                                          "MIRRORED_COLLECTIVE_TIMEOUT_S)"));
    }
    // The server's generation: a restarted chief has a new one, so no key of an earlier attempt
    // is ever read.
    generation = client->generation();
    tcp_ = client.get();
    store_ = std::move(client);
  } else {
    throw InvalidArgumentError(
        str_cat("MIRRORED_STORE must be 'tcp' (the chief's store, default) or "
                "'file:<directory on a shared file system>', got '",
                spec, "'"));
  }
  prefix_ = job_id_ + "/" + generation + "/";
}

void Coordinator::start_server(const std::string& host, int port, double timeout_s) {
  try {
    server_ = std::make_unique<StoreServer>(host, port, job_id_, layout_.names, peer_timeout_s_);
  } catch (const UnavailableError& taken) {
    const UnavailableError listen_error = taken;
    // The port is taken. If the store there is this job's, another process already is worker 0:
    // its store refuses a second monitor for worker 0 and tells every worker starting up why.
    std::unique_ptr<TcpStoreClient> probe;
    try {
      probe = std::make_unique<TcpStoreClient>(host, port, job_id_, 0, TcpStoreClient::Role::monitor,
                                               std::min(timeout_s, kDuplicateProbeSeconds), layout_.names);
    } catch (const InvalidArgumentError&) {
      throw;
    } catch (const std::exception&) {
      throw listen_error;  // another job's store, or none that answers: the port is taken
    }
    // This job's store without a monitor for worker 0 yet: its chief is still starting, and it is
    // another process than this one all the same.
    const std::string why = str_cat("start-up: two workers claim task index 0 (", name(0),
                                    "): this process could not listen on its port, where the other serves the "
                                    "job's store; give every worker its own task.index in TF_CONFIG");
    try {
      probe->set_if_absent(startup_error_key(job_id_ + "/" + probe->generation() + "/"), why);
    } catch (const std::exception&) {
      // The other process found this one's probe first and gave up (its store with it).
    }
    throw InvalidArgumentError("MultiWorkerMirroredStrategy " + why);
  }
}

std::string Coordinator::name_joins(const std::vector<std::string>& join_keys) const {
  std::string who;
  for (const auto& key : join_keys)
    who += str_cat(who.empty() ? "" : ", ", name(std::stoi(key.substr(key.rfind('/') + 1))));
  return who;
}

std::vector<std::string> Coordinator::wait_for_workers(const std::vector<std::string>& keys,
                                                       Clock::time_point deadline) {
  // In slices, so that a worker configured differently (published by the chief's store) fails
  // every worker at once instead of at the timeout.
  const std::string error_key = startup_error_key(prefix_);
  const auto start = Clock::now();
  auto next_warning = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_warn_s_));
  while (true) {
    const double left = net::seconds_until(deadline);
    std::vector<std::string> missing = store_->wait(keys, std::clamp(left, 0.0, kStartupPollSeconds));
    if (missing.empty()) return missing;
    if (auto why = store_->get(error_key, 0)) throw InvalidArgumentError("MultiWorkerMirroredStrategy " + *why);
    if (left <= kStartupPollSeconds) return missing;
    if (Clock::now() >= next_warning) {
      // A host that never answers is indistinguishable from one that starts late: the start-up
      // timeout decides, and meanwhile nobody waits silently.
      MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()), " has waited ",
                   static_cast<int>(std::chrono::duration<double>(Clock::now() - start).count()), " s at start-up for ",
                   name_joins(missing), " (start-up timeout in ", static_cast<int>(left), " s; MIRRORED_STALL_WARN_S)");
      next_warning += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_warn_s_));
    }
  }
}

void Coordinator::meet(Clock::time_point deadline, int local_replicas, const std::string& device_kind) {
  WorkerInfo me;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  me.hostname = host;
  me.boot_id = read_small_file("/proc/sys/kernel/random/boot_id");
  char ns[256] = {};
  const ssize_t n = readlink("/proc/self/ns/ipc", ns, sizeof(ns) - 1);
  me.ipc_namespace = n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : "";
  char pidns[256] = {};
  const ssize_t m = readlink("/proc/self/ns/pid", pidns, sizeof(pidns) - 1);
  me.pid_namespace = m > 0 ? std::string(pidns, static_cast<std::size_t>(m)) : "";
  me.local_replicas = local_replicas;
  me.device_kind = device_kind;
  me.pid = static_cast<long>(getpid());
  me.default_gpus = default_gpus_;
  if (tcp_) {
    me.heartbeat_host = layout_.own_host();
    peer_watch_ = std::make_unique<PeerWatch>(me.heartbeat_host);
    me.heartbeat_port = peer_watch_->port();
  }
  store_->set(prefix_ + "join/" + std::to_string(rank()), me.encode());

  std::vector<std::string> keys;
  for (int w = 0; w < num_workers(); ++w) keys.push_back(prefix_ + "join/" + std::to_string(w));
  // The chief waits a little longer than the others, so that they (whose store it serves) report
  // a missing worker themselves before it gives up and its store goes away.
  const double grace = rank() == 0 && tcp_ ? kChiefStartupGraceSeconds : 0.0;
  std::vector<std::string> missing;
  try {
    missing = wait_for_workers(
        keys, deadline + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace)));
  } catch (const UnavailableError& e) {
    throw UnavailableError(
        str_cat("MultiWorkerMirroredStrategy: ", name(0), " went away while the workers were starting up: ", e.what()));
  }
  if (!missing.empty()) {
    throw DeadlineExceededError(str_cat("MultiWorkerMirroredStrategy: ", name_joins(missing),
                                        missing.size() == 1 ? " has" : " have", " not joined the job within ",
                                        timeout_s_,
                                        " s (start-up timeout: CommunicationOptions::timeout_seconds or "
                                        "MIRRORED_COLLECTIVE_TIMEOUT_S); ",
                                        store_->describe()));
  }
  for (int w = 0; w < num_workers(); ++w) {
    auto text = store_->get(keys[static_cast<std::size_t>(w)], 0);
    infos_.push_back(WorkerInfo::decode(text.value_or("")));
  }
  for (int w = 1; w < num_workers(); ++w) {
    const auto& a = infos_[0];
    const auto& b = infos_[static_cast<std::size_t>(w)];
    MIRRORED_ENFORCE(a.local_replicas == b.local_replicas, InvalidArgumentError,
                     "MultiWorkerMirroredStrategy: ", name(0), " has ", a.local_replicas, " local replicas but ",
                     name(w), " has ", b.local_replicas, "; every worker must have the same number");
  }
}

void Coordinator::fail_locally(const FailureNotice& notice) {
  std::function<void()> also;
  {
    std::lock_guard lock(mu_);
    if (!failure_) {
      failure_ = notice;
      also = on_failure_;
    }
  }
  poll_cv_.notify_all();
  if (transport_) transport_->interrupt();
  if (also) also();
}

FailureNotice Coordinator::fail(FailureNotice notice) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return *failure_;
  }
  try {
    if (!store_->set_if_absent(failure_key(prefix_), encode_failure(notice))) {
      if (auto first = published_failure(0)) notice = *first;
    }
  } catch (const std::exception&) {
    // The store is gone as well; this worker reports what it saw.
  }
  fail_locally(notice);
  std::lock_guard lock(mu_);
  failure_reported_ = true;
  return *failure_;
}

std::optional<FailureNotice> Coordinator::published_failure(double wait_s) {
  if (store_lost_.load()) return std::nullopt;
  try {
    if (auto v = store_->get(failure_key(prefix_), wait_s)) return decode_failure(*v);
  } catch (const UnavailableError& e) {
    // The chief's store is unreachable: the chief is the worker that went away.
    if (tcp_) {
      return FailureNotice{static_cast<int>(ErrorCode::UNAVAILABLE),
                           str_cat(name(0), " is gone: the connection to its store failed (", e.what(), ")")};
    }
  } catch (const std::exception&) {
    // The store does not answer: the caller reports what it saw itself.
  }
  return std::nullopt;
}

void Coordinator::collective(const char* what, const mirrored::Deadline& call_deadline,
                             const std::function<void(Clock::time_point)>& body) {
  {
    std::unique_lock lock(mu_);
    if (failure_) {
      if (!failure_reported_) {
        failure_reported_ = true;
        FailureNotice n = *failure_;
        lock.unlock();
        n.message = str_cat("MultiWorkerMirroredStrategy: ", what, ": ", n.message,
                            with_separator(flight_report(kFlightReportWaitSeconds)));
        throw_failure(n);
      }
      throw FailedPreconditionError(str_cat("MultiWorkerMirroredStrategy: ", what,
                                            " cannot run: the job failed earlier (", failure_->message,
                                            "); restart every worker to recover"));
    }
  }
  const int64_t seq = seq_.fetch_add(1) + 1;
  {
    std::unique_lock lock(mu_);
    for (const auto& [w, count] : departed_) {
      if (seq > count) {
        failure_ = FailureNotice{static_cast<int>(ErrorCode::FAILED_PRECONDITION),
                                 str_cat(name(w), " left the job after ", count, " cross-worker collectives, so ", what,
                                         " (collective ", seq,
                                         ") has no partner there: the workers made different numbers of collective "
                                         "calls")};
        failure_reported_ = true;
        std::string message = str_cat("MultiWorkerMirroredStrategy: ", what, ": ", failure_->message);
        lock.unlock();
        message += with_separator(flight_report(0));
        transport_->interrupt();
        throw FailedPreconditionError(message);
      }
    }
  }
  in_flight_what_.store(what);
  in_flight_.store(seq);
  // The call's deadline, made where it entered the library: the local rendezvous before this
  // point has spent part of it already.
  const auto deadline = call_deadline.time_point();
  const double timeout_s = call_deadline.timeout_seconds();
  try {
    body(deadline);
  } catch (const TransportError& e) {
    in_flight_.store(0);
    fail_collective(what, deadline, timeout_s, e);
  } catch (...) {
    in_flight_.store(0);  // a usage error every worker raised alike (the transport is fine)
    throw;
  }
  in_flight_.store(0);
}

void Coordinator::fail_collective(const char* what, Clock::time_point deadline, double timeout_s,
                                  const TransportError& error) {
  std::optional<FailureNotice> notice;
  {
    std::lock_guard lock(mu_);
    notice = failure_;
  }
  const bool timed_out = error.timed_out || Clock::now() >= deadline;
  // A timeout is usually this worker's own finding. A connection that failed has a cause another worker or the chief's
  // store publishes at once, or it is the chief's loss, which the monitor finds (asking the chief's store here would
  // wait for the answer that never comes).
  if (!notice) notice = timed_out ? published_failure(kTimeoutCauseWaitSeconds) : monitor_verdict();
  if (!notice) {
    FailureNotice mine;
    if (timed_out) {
      mine = {static_cast<int>(ErrorCode::DEADLINE_EXCEEDED),
              str_cat("a cross-worker collective did not complete within the collective timeout of ", timeout_s,
                      " s (set CommunicationOptions::timeout_seconds or MIRRORED_COLLECTIVE_TIMEOUT_S)",
                      describe_stale(), "; seen by ", name(rank()), ": ", error.message)};
    } else {
      mine = {static_cast<int>(ErrorCode::UNAVAILABLE),
              str_cat("a connection between workers failed (seen by ", name(rank()), "): ", error.message)};
    }
    // The first failure published is the job's: every worker reports the same cause.
    try {
      if (!store_->set_if_absent(failure_key(prefix_), encode_failure(mine))) {
        if (auto first = published_failure(0)) mine = *first;
      }
    } catch (const std::exception&) {
      // The store is gone as well; report what this worker saw.
    }
    notice = mine;
  }
  fail_locally(*notice);
  {
    std::lock_guard lock(mu_);
    failure_reported_ = true;
  }
  FailureNotice n = *notice;
  n.message = str_cat("MultiWorkerMirroredStrategy: ", what, ": ", n.message,
                      with_separator(flight_report(kFlightReportWaitSeconds)));
  throw_failure(n);
}

void Coordinator::post_flight_state() noexcept {
  FlightRecorder* recorder = recorder_.load();
  if (!recorder || !recorder->enabled() || !store_ || store_lost_.load()) return;
  dump_flight_recorders_on_event(rank());
  try {
    store_->set(str_cat(prefix_, "flight/", rank()), encode_flights(recorder->flights()));
  } catch (const std::exception& e) {
    MIRRORED_LOG(debug, "flight recorder: could not post this worker's state: ", e.what());
  }
}

std::string Coordinator::flight_report(double wait_s) noexcept {
  FlightRecorder* recorder = recorder_.load();
  if (!recorder || !recorder->enabled() || !store_) return "";
  if (store_lost_.load()) return "flight recorder: no report (the chief's store is lost)";
  try {
    dump_flight_recorders_on_event(rank());
    std::vector<ReplicaFlight> all = recorder->flights();
    store_->set(str_cat(prefix_, "flight/", rank()), encode_flights(all));
    std::vector<std::string> silent;
    const auto until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
    for (int w = 0; w < num_workers(); ++w) {
      if (w == rank()) continue;
      const double left = std::max(0.0, std::chrono::duration<double>(until - Clock::now()).count());
      std::optional<std::string> state;
      try {
        state = store_->get(str_cat(prefix_, "flight/", w), left);
      } catch (const std::exception&) {
        // The store is gone: the worker counts as silent.
      }
      if (!state) {
        silent.push_back(str_cat(name(w), " reported no state within ", wait_s, " s (stopped, hung or gone)"));
        continue;
      }
      for (auto& f : decode_flights(*state)) all.push_back(std::move(f));
    }
    std::stable_sort(all.begin(), all.end(),
                     [](const ReplicaFlight& a, const ReplicaFlight& b) { return a.worker < b.worker; });
    return compose_flight_report(all, silent);
  } catch (const std::exception& e) {
    return str_cat("flight recorder: no report (", e.what(), ")");
  }
}

void Coordinator::shutdown() noexcept {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  if (peer_watch_) peer_watch_->stop();
  bool failed;
  {
    std::lock_guard lock(mu_);
    failed = failure_.has_value();
  }
  if (!failed && store_) {
    // Goodbye, then wait until every worker has left: nobody closes a connection that another
    // worker may still read from, and the chief keeps serving the store until the last one.
    try {
      if (tcp_) {
        tcp_->bye(seq_.load());
        if (!tcp_->wait_all_gone(timeout_s_))
          MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()),
                       " leaves before every other worker has (waited ", timeout_s_, " s)");
      } else {
        store_->set(prefix_ + "bye/" + std::to_string(rank()), std::to_string(seq_.load()));
        std::vector<std::string> keys;
        for (int w = 0; w < num_workers(); ++w) keys.push_back(prefix_ + "bye/" + std::to_string(w));
        if (!store_->wait(keys, timeout_s_).empty())
          MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()),
                       " leaves before every other worker has (waited ", timeout_s_, " s)");
      }
    } catch (const std::exception& e) {
      MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()), " could not say goodbye: ", e.what());
    }
  } else if (server_ && tcp_) {
    // After a failure the chief's store still tells the others its cause: it stays until they
    // have gone (their processes exit or their strategies are destroyed), for a while at most.
    monitor_store_.reset();
    try {
      tcp_->wait_all_gone(kFailureLingerSeconds);
    } catch (const std::exception&) {
      // Best effort.
    }
  }
  transport_.reset();
  monitor_store_.reset();
  tcp_ = nullptr;
  store_.reset();
  // Every other worker said goodbye, but may still be waiting at the store for the last one:
  // stopping now would reset their connections.
  if (server_ && !failed && !server_->wait_until_disconnected(kGoodbyeLingerSeconds))
    MIRRORED_LOG(debug, "MultiWorkerMirroredStrategy: the chief stops its store while a worker is still connected");
  server_.reset();
}

}  // namespace mirrored::detail::cluster
