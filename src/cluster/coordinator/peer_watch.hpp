#pragma once
// Private: heartbeats between ring neighbours on UDP sockets of their own (apart from the
// transport's connections and the chief's store), so that two workers that can no longer reach
// each other are found within the peer timeout even while both still reach the chief, and even
// while a collective legitimately takes minutes. Each worker sends to its two ring neighbours
// only (the pairs the ring collectives use): two datagrams per worker per interval, whatever the
// job's size. A worker cut off from everyone is the chief's store's finding (a lost worker); this
// watch names the pair.

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/net/socket.hpp"

namespace mirrored::detail::cluster {

class PeerWatch {
 public:
  using Clock = std::chrono::steady_clock;
  /// A neighbour: its rank and its heartbeat socket's address.
  struct Peer {
    int rank = 0;
    std::string host;
    int port = 0;
  };

  /// Binds a UDP socket on `host` (this worker's address; every address when it is not one of
  /// this machine's), any free port (net::datagram_socket_on). \throws UnavailableError when no
  /// socket can be bound.
  explicit PeerWatch(const std::string& host);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  /// The bound port, for the other workers (published when joining).
  int port() const noexcept { return port_; }

  /// Starts heartbeating: every `interval_s` a datagram carrying `token` (this job attempt) and
  /// `rank` goes to each peer; a peer heard from neither at start nor for `timeout_s` since makes
  /// `on_silent(rank)` run once, on the watch's thread. Datagrams of another token are ignored.
  /// \throws InvalidArgumentError when a peer's host does not resolve.
  void start(int rank, const std::vector<Peer>& peers, const std::string& token, double interval_s, double timeout_s,
             std::function<void(int)> on_silent);
  /// Stops the thread (also done by the destructor). Idempotent.
  void stop() noexcept;

 private:
  struct Target;
  void loop();
  void receive(Clock::time_point until);

  net::Fd fd_;
  int port_ = 0;
  int rank_ = 0;
  std::string token_;
  double interval_s_ = 1.0;
  double timeout_s_ = 10.0;
  std::vector<Target> targets_;
  std::function<void(int)> on_silent_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// The ring neighbours of `rank` among `n` workers (none for one worker, one for two).
std::vector<int> ring_neighbours(int rank, int n);

}  // namespace mirrored::detail::cluster
