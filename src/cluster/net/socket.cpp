#include "cluster/net/socket.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "mirrored/errors.hpp"

namespace mirrored::detail::net {
namespace {

constexpr double kMaxSeconds = 1e9;

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const noexcept { freeaddrinfo(p); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfo resolve(const std::string& host, int port, bool passive, int socktype = SOCK_STREAM) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0) {
    throw InvalidArgumentError(str_cat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  return AddrInfo(out);
}

// Waits until `fd` is ready for `events` or the deadline passes; false on timeout.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const double left = seconds_until(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min(left * 1000.0 + 1, 60000.0));
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the following call report the error
  }
}

}  // namespace

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::clamp(seconds, 0.0, kMaxSeconds)));
}

double seconds_until(Clock::time_point deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(std::exchange(o.fd_, -1));
  return *this;
}

void Fd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::pair<std::string, int> split_host_port(const std::string& address, const std::string& what) {
  const auto colon = address.rfind(':');
  MIRRORED_ENFORCE(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), InvalidArgumentError, what,
                   ": address '", address, "' is not of the form host:port");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  int port = 0;
  bool ok = !port_text.empty() && port_text.size() <= 5;
  for (char c : port_text) ok = ok && c >= '0' && c <= '9';
  if (ok) port = std::stoi(port_text);
  MIRRORED_ENFORCE(ok && port >= 1 && port <= 65535, InvalidArgumentError, what, ": address '", address,
                   "' has no valid port (1..65535)");
  return {host, port};
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Fd connect_until(const std::string& host, int port, Clock::time_point deadline, const std::string& who) {
  std::string last_error = "no attempt";
  auto pause = std::chrono::milliseconds(20);
  while (true) {
    const AddrInfo addrs = resolve(host, port, false);
    for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd) {
        last_error = std::strerror(errno);
        continue;
      }
      int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        if (!wait_ready(fd.get(), POLLOUT, deadline)) {
          last_error = "connect timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        set_nodelay(fd.get());
        return fd;
      }
      last_error = std::strerror(errno);
    }
    if (seconds_until(deadline) <= 0) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  // `who` names the address already ("the chief's store at 10.0.0.1:2222").
  throw DeadlineExceededError(str_cat("could not connect to ", who, " (", last_error, ")"));
}

bool loopback_alias(const std::string& host, const std::vector<std::string>& addresses) {
  auto loopback = [](const std::string& a) { return a.rfind("127.", 0) == 0 || a == "::1"; };
  if (addresses.empty() || host == "localhost") return false;
  for (const auto& a : addresses)
    if (a == host || !loopback(a)) return false;  // a literal, or an address others can reach
  return true;
}

namespace {

// The numeric addresses of `addrs`.
std::vector<std::string> numeric_addresses(const AddrInfo& addrs) {
  std::vector<std::string> out;
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    char text[NI_MAXHOST] = {};
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0)
      out.emplace_back(text);
  }
  return out;
}

// A socket of `socktype` bound to `host:port` (listening, for a stream), or to every address when
// the name is not one of this machine's (NAT, a load balancer's name) or is this machine's name
// for a loopback address (`loopback_alias`); `err` is the last errno.
Fd bind_on(const std::string& host, int port, int socktype, int& err) {
  auto try_bind = [&](const AddrInfo& addrs) -> Fd {
    for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd) continue;
      int one = 1;
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) == 0 &&
          (socktype != SOCK_STREAM || ::listen(fd.get(), 1024) == 0))
        return fd;
      err = errno;
    }
    return Fd();
  };
  AddrInfo addrs = resolve(host, port, false, socktype);
  if (loopback_alias(host, numeric_addresses(addrs))) addrs = resolve("", port, true, socktype);
  Fd fd = try_bind(addrs);
  if (!fd && err == EADDRNOTAVAIL) {
    err = 0;
    fd = try_bind(resolve("", port, true, socktype));
  }
  return fd;
}

}  // namespace

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

Fd datagram_socket_on(const std::string& host) {
  int err = 0;
  Fd fd = bind_on(host, 0, SOCK_DGRAM, err);
  if (!fd) throw UnavailableError(str_cat("cannot bind a UDP socket on ", host, ": ", std::strerror(err)));
  return fd;
}

std::pair<sockaddr_storage, socklen_t> datagram_address(const std::string& host, int port) {
  const AddrInfo addrs = resolve(host, port, false, SOCK_DGRAM);
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, addrs->ai_addr, addrs->ai_addrlen);
  out.second = addrs->ai_addrlen;
  return out;
}

Fd listen_on(const std::string& host, int port) {
  int err = 0;
  Fd fd = bind_on(host, port, SOCK_STREAM, err);
  if (!fd) {
    throw UnavailableError(str_cat("cannot listen on ", host, ":", port, ": ", std::strerror(err),
                                   err == EADDRINUSE ? " (is another job's chief still running on this port?)" : ""));
  }
  return fd;
}

std::string local_address_towards(const std::string& host, int port) {
  std::string last_error = "no address";
  const AddrInfo addrs = resolve(host, port, false);
  for (addrinfo* a = addrs.get(); a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[NI_MAXHOST] = {};
    if (!fd || ::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (const int rc =
            ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
        rc != 0) {
      last_error = gai_strerror(rc);
      continue;
    }
    return text;
  }
  throw UnavailableError(
      str_cat("cannot find this machine's address on the route to ", host, ":", port, " (", last_error, ")"));
}

void send_all(int fd, const void* data, std::size_t size, Clock::time_point deadline, const std::string& who) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline)) throw DeadlineExceededError(str_cat(who, " did not accept data in time"));
      continue;
    }
    throw UnavailableError(str_cat("the connection to ", who, " failed: ", std::strerror(errno)));
  }
}

void recv_all(int fd, void* data, std::size_t size, Clock::time_point deadline, const std::string& who) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) throw UnavailableError(str_cat("the connection to ", who, " closed"));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLIN, deadline)) throw DeadlineExceededError(str_cat(who, " did not answer in time"));
      continue;
    }
    throw UnavailableError(str_cat("the connection to ", who, " failed: ", std::strerror(errno)));
  }
}

}  // namespace mirrored::detail::net
