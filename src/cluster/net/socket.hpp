#pragma once
// Private: the few TCP socket operations the store needs, each bounded by a deadline. Sends use
// MSG_NOSIGNAL, so a peer that went away gives an error, never a SIGPIPE.

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mirrored::detail::net {

using Clock = std::chrono::steady_clock;

/// A deadline `seconds` from now (capped, so that huge timeouts cannot overflow the clock).
Clock::time_point deadline_after(double seconds);
/// Seconds left until `deadline` (0 when past).
double seconds_until(Clock::time_point deadline);

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// "host:port" split at the last ':' ("[::1]:80" for IPv6). \throws InvalidArgumentError naming
/// `what` for a missing host or a port outside 1..65535.
std::pair<std::string, int> split_host_port(const std::string& address, const std::string& what);

/// Connects to `host:port`, retrying refused or unreachable attempts until `deadline` (a peer
/// that starts later is normal at start-up). `who` names the peer with its address ("the chief's
/// store at 10.0.0.1:2222"). \throws DeadlineExceededError naming `who` when no attempt succeeded
/// in time; InvalidArgumentError when the host does not resolve.
Fd connect_until(const std::string& host, int port, Clock::time_point deadline, const std::string& who);

/// A listening socket on `host:port` (the host's own address, or every address when it is not
/// one of this machine's, or when it is a name that this machine resolves to loopback addresses
/// only: `loopback_alias`). \throws UnavailableError naming the address when the port is taken.
Fd listen_on(const std::string& host, int port);

/// Whether `host`, a name (not an address literal, not "localhost") whose addresses here are
/// `addresses` (numeric), resolves to loopback addresses only. Debian's /etc/hosts maps a machine's
/// own name to 127.0.1.1: the chief named so by a launcher (MASTER_ADDR=$(hostname)) would listen
/// where only its own machine can reach it, while the other machines resolve the same name to its
/// real address. A socket for such a name is bound to every address instead (as a launcher's own
/// store does).
bool loopback_alias(const std::string& host, const std::vector<std::string>& addresses);

/// A UDP socket bound to `host` (every address when it is not one of this machine's), any free
/// port (`bound_port`), non-blocking. \throws UnavailableError when none can be bound;
/// InvalidArgumentError when the host does not resolve.
Fd datagram_socket_on(const std::string& host);
/// The first address of `host:port` for UDP. \throws InvalidArgumentError when it does not resolve.
std::pair<sockaddr_storage, socklen_t> datagram_address(const std::string& host, int port);
/// The local port a socket is bound to.
int bound_port(int fd);

/// This machine's address (numeric) on the route to `host:port`: the address a connection to it
/// would leave from, found without sending anything (a UDP socket's connect). \throws
/// InvalidArgumentError when the host does not resolve; UnavailableError naming it when no
/// address of it is routable.
std::string local_address_towards(const std::string& host, int port);

/// Writes all of `data` before `deadline`. \throws UnavailableError when the peer closed the
/// connection, DeadlineExceededError past the deadline (both naming `who`).
void send_all(int fd, const void* data, std::size_t size, Clock::time_point deadline, const std::string& who);
/// Reads exactly `size` bytes before `deadline` (same errors; a clean close is UnavailableError).
void recv_all(int fd, void* data, std::size_t size, Clock::time_point deadline, const std::string& who);

/// Sets O_NONBLOCK and FD_CLOEXEC, and TCP_NODELAY on sockets (small requests, answered at once).
void set_nonblocking(int fd);
void set_nodelay(int fd);

}  // namespace mirrored::detail::net
