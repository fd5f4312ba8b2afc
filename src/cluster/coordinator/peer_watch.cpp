// Heartbeats between ring neighbours (peer_watch.hpp).
#include "cluster/coordinator/peer_watch.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

struct PeerWatch::Target {
  int rank = 0;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  Clock::time_point last_heard;
  bool reported = false;
};

namespace {

// The address of `host:port` for UDP. \throws InvalidArgumentError when it does not resolve.
std::pair<sockaddr_storage, socklen_t> resolve_udp(const std::string& host, int port, int passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = passive;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw InvalidArgumentError(
        str_cat("peer heartbeats: the host '", host, "' does not resolve (", gai_strerror(rc), ")"));
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, res->ai_addr, res->ai_addrlen);
  out.second = res->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

}  // namespace

std::vector<int> ring_neighbours(int rank, int n) {
  if (n < 2) return {};
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  if (next == prev) return {next};
  return {prev, next};
}

PeerWatch::PeerWatch(const std::string& host) {
  // This worker's own address if it is one of this machine's; else (a name behind NAT, a
  // container's published port) every address, as the store's listener does.
  for (const std::string& h : {host, std::string()}) {
    auto [addr, len] = resolve_udp(h, 0, AI_PASSIVE);
    net::Fd fd(::socket(addr.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) continue;
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      fd_ = std::move(fd);
      port_ = bound_port(fd_.get());
      return;
    }
  }
  throw UnavailableError(
      str_cat("peer heartbeats: no UDP socket could be bound on '", host, "': ", std::strerror(errno)));
}

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
    std::tie(t.addr, t.addr_len) = resolve_udp(p.host, p.port, 0);
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
