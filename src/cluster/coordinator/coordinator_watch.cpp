// The coordinator's watch while the job runs (coordinator.hpp): the monitor thread that polls
// the chief's store (its polls are this worker's heartbeats, their answers the chief's), the ring
// neighbours' heartbeats (peer_watch.hpp), the verdict a failed collective waits for, and the
// stall warning across workers.
#include <algorithm>

#include "cluster/coordinator/coordinator.hpp"
#include "cluster/store/tcp_store.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail::cluster {
namespace {

constexpr double kMonitorPollSeconds = 0.25;
// How long a worker that found a silent neighbour waits for the chief to publish the cause (the
// chief's store publishes a worker it no longer hears within a poll of the same finding).
constexpr double kCauseWaitSeconds = 1.0;
// A worker whose monitor has not polled the chief's store for this long is reported as stopped.
constexpr double kStaleSeconds = 2.0;

}  // namespace

void Coordinator::monitor_loop() {
  auto stopping = [&] {
    std::lock_guard lock(mu_);
    return stopping_;
  };
  int loops = 0;
  while (!stopping()) {
    std::optional<std::string> failure;
    std::vector<std::pair<int, int64_t>> departed;
    try {
      if (monitor_store_) {
        failure = monitor_store_->get(failure_key(prefix_), kMonitorPollSeconds);  // long poll
        if (!failure) departed = monitor_store_->departed(kMonitorPollSeconds);
        if (const int w = silent_neighbour_.exchange(-1); !failure && w > 0 && neighbour_silent(w)) return;
      } else {
        failure = store_->get(failure_key(prefix_), 0);
        if (!failure && ++loops % 4 == 0) {
          for (int w = 0; w < num_workers(); ++w) {
            if (auto bye = store_->get(prefix_ + "bye/" + std::to_string(w), 0))
              departed.emplace_back(w, std::stoll(*bye));
          }
        }
        std::unique_lock lock(mu_);
        stop_cv_.wait_for(lock, std::chrono::duration<double>(kMonitorPollSeconds / 2), [&] { return stopping_; });
      }
    } catch (const UnavailableError& e) {
      if (stopping()) return;
      fail_locally({static_cast<int>(ErrorCode::UNAVAILABLE),
                    str_cat(name(0), " is gone: the connection to its store failed (", e.what(), ")")});
      return;
    } catch (const std::exception& e) {
      if (stopping()) return;
      // The chief's store has not answered a poll for the peer timeout: the chief is stopped,
      // its host is down, or this worker is cut off from it. Either way the job has failed.
      MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()), ": ", e.what());
      store_lost_.store(true);  // nothing more is asked of it: each request would wait its slack
      fail_locally(lost_worker_notice(name(0), peer_timeout_s_));
      return;
    }
    warn_if_stalled();
    if (failure) {
      post_flight_state();  // for the report of the worker that failed (and of every other)
      fail_locally(decode_failure(*failure));
      return;
    }
    {
      std::lock_guard lock(mu_);
      ++polls_;  // the chief answered: no failure was published before this poll
    }
    poll_cv_.notify_all();
    for (const auto& [w, count] : departed) {
      if (w == rank()) continue;
      std::lock_guard lock(mu_);
      bool known = false;
      for (const auto& d : departed_) known = known || d.first == w;
      if (!known) departed_.emplace_back(w, count);
    }
    const int64_t now = in_flight_.load();
    for (const auto& [w, count] : departed) {
      if (w != rank() && now > count) {
        fail_locally({static_cast<int>(ErrorCode::FAILED_PRECONDITION),
                      str_cat(name(w), " left the job after ", count,
                              " cross-worker collectives while this worker waits in collective ", now,
                              ": the workers made different numbers of collective calls")});
        return;
      }
    }
  }
}

void Coordinator::start_peer_watch() {
  if (!peer_watch_) return;
  std::vector<PeerWatch::Peer> peers;
  for (int w : ring_neighbours(rank(), num_workers())) {
    const WorkerInfo& info = infos_[static_cast<std::size_t>(w)];
    if (info.heartbeat_port <= 0) continue;
    peers.push_back({w, info.heartbeat_host, info.heartbeat_port});
  }
  // Several beats per timeout, so that a few lost datagrams never make a neighbour silent.
  // The chief's silence is the monitor's own finding; the other neighbours' is checked by the
  // monitor thread, on its connection (whose requests end within the peer timeout).
  peer_watch_->start(rank(), peers, prefix_, std::min(1.0, peer_timeout_s_ / 5), peer_timeout_s_, [this](int w) {
    if (w != 0) silent_neighbour_.store(w);
  });
}

bool Coordinator::neighbour_silent(int w) {
  // A worker cut off from everyone is also silent to the chief, which publishes it within
  // moments of this; a published failure is the job's. A request that gets no answer throws:
  // then this worker is the one cut off, and the monitor reports the chief's loss.
  std::optional<std::string> published = monitor_store_->get(failure_key(prefix_), kCauseWaitSeconds);
  FailureNotice notice;
  if (published) {
    notice = decode_failure(*published);
  } else {
    const auto stale = monitor_store_->stale_workers(peer_timeout_s_ / 2, kCauseWaitSeconds);
    const bool lost = std::find(stale.begin(), stale.end(), w) != stale.end();
    notice = lost ? lost_worker_notice(name(w), peer_timeout_s_)
                  : unreachable_pair_notice(name(std::min(w, rank())), name(std::max(w, rank())), peer_timeout_s_);
    if (!monitor_store_->set_if_absent(failure_key(prefix_), encode_failure(notice))) {
      if (auto first = monitor_store_->get(failure_key(prefix_), 0)) notice = decode_failure(*first);
    }
  }
  MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()), ": ", notice.message);
  post_flight_state();
  fail_locally(notice);
  return true;
}

void Coordinator::warn_if_stalled() {
  const int64_t seq = in_flight_.load();
  if (seq != stall_seq_) {
    stall_seq_ = seq;
    stall_since_ = Clock::now();
    stall_warned_ = false;
    return;
  }
  if (seq == 0 || stall_warned_ || Clock::now() - stall_since_ < std::chrono::duration<double>(stall_warn_s_)) return;
  stall_warned_ = true;
  const std::string stale = describe_stale();
  MIRRORED_LOG(warn, "MultiWorkerMirroredStrategy: ", name(rank()), " has waited ", stall_warn_s_,
               " s in cross-worker collective #", seq, " (", in_flight_what_.load(), ")",
               stale.empty() ? "; every worker's heartbeat is fresh (alive, but not in this collective yet, or a "
                               "slow link)"
                             : stale,
               " (MIRRORED_STALL_WARN_S)");
}

std::optional<FailureNotice> Coordinator::monitor_verdict() {
  // A failure published anywhere reaches the monitor within a poll; the chief's own loss within
  // the peer timeout. Two polls completed after this point prove the chief answers and nothing was
  // published: then this worker's own finding is the first.
  std::unique_lock lock(mu_);
  const int64_t start = polls_;
  poll_cv_.wait_for(lock, std::chrono::duration<double>(peer_timeout_s_ + kCauseWaitSeconds),
                    [&] { return failure_.has_value() || polls_ >= start + 2 || stopping_; });
  return failure_;
}

std::string Coordinator::describe_stale() {
  if (!tcp_) return "";
  try {
    const auto stale = tcp_->stale_workers(kStaleSeconds, kStaleSeconds);
    if (stale.empty()) return "";
    std::string who;
    for (int w : stale) who += str_cat(who.empty() ? "" : ", ", name(w));
    return str_cat("; stopped or hung (no sign of life for ", kStaleSeconds, " s): ", who);
  } catch (const std::exception&) {
    return str_cat("; the chief's store did not answer either (", name(0), " may be stopped or hung)");
  }
}

}  // namespace mirrored::detail::cluster
