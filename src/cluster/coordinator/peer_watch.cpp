// Heartbeats between ring neighbours (peer_watch.hpp).
#include "cluster/coordinator/peer_watch.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <string_view>
#include <tuple>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

struct PeerWatch::Target {
  int rank = 0;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  Clock::time_point last_heard;
  bool reported = false;
};

std::vector<int> ring_neighbours(int rank, int n) {
  if (n < 2) return {};
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  if (next == prev) return {next};
  return {prev, next};
}

PeerWatch::PeerWatch(const std::string& host) : fd_(net::datagram_socket_on(host)), port_(net::bound_port(fd_.get())) {}

PeerWatch::~PeerWatch() { stop(); }

void PeerWatch::start(int rank, const std::vector<Peer>& peers, const std::string& token, double interval_s,
                      double timeout_s, std::function<void(int)> on_silent) {
  rank_ = rank;
  token_ = token;
  interval_s_ = interval_s;
  timeout_s_ = timeout_s;
  on_silent_ = std::move(on_silent);
  const auto now = Clock::now();
  for (const auto& p : peers) {
    Target t;
    t.rank = p.rank;
    std::tie(t.addr, t.addr_len) = net::datagram_address(p.host, p.port);
    t.last_heard = now;
    targets_.push_back(t);
  }
  if (!targets_.empty()) thread_ = std::thread([this] { loop(); });
}

void PeerWatch::stop() noexcept {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::loop() {
  const std::string beat = str_cat(token_, "|", rank_);
  const auto interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s_));
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  auto next_beat = Clock::now();
  while (!stop_.load()) {
    const auto now = Clock::now();
    if (now >= next_beat) {
      for (const auto& t : targets_)
        // Best effort: a send that fails (no route while a link is down) is a missed beat.
        (void)::sendto(fd_.get(), beat.data(), beat.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&t.addr),
                       t.addr_len);
      next_beat = now + interval;
    }
    receive(std::min(next_beat, now + std::chrono::milliseconds(100)));
    for (auto& t : targets_) {
      if (t.reported || Clock::now() - t.last_heard <= limit || stop_.load()) continue;
      t.reported = true;
      on_silent_(t.rank);
    }
  }
}

void PeerWatch::receive(Clock::time_point until) {
  char buf[512];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left))) <= 0) return;
    const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n <= 0) continue;
    const std::string_view text(buf, static_cast<std::size_t>(n));
    const auto bar = text.rfind('|');
    if (bar == std::string_view::npos || text.substr(0, bar) != token_) continue;
    int from = -1;
    try {
      from = std::stoi(std::string(text.substr(bar + 1)));
    } catch (const std::exception&) {
      continue;
    }
    for (auto& t : targets_)
      if (t.rank == from) t.last_heard = Clock::now();
  }
}

}  // namespace mirrored::detail::cluster
