#include "cluster/store/tcp_store.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>

#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail::cluster {
namespace {

using net::Clock;

enum Op : uint8_t { kHello = 1, kSet, kSetIfAbsent, kGet, kWait, kBye, kGone, kStale, kDeparted };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

constexpr uint32_t kMaxFrame = 16u << 20;  // requests are small: addresses, ids, notices
constexpr std::size_t kMaxClients = 4096;

struct Writer {
  std::string buf = std::string(4, '\0');  // room for the length
  Writer& u8(uint8_t v) {
    buf.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& i64(int64_t v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Writer& str(const std::string& s) {
    const auto n = static_cast<uint32_t>(s.size());
    buf.append(reinterpret_cast<const char*>(&n), sizeof(n));
    buf.append(s);
    return *this;
  }
  std::string frame() {
    const auto n = static_cast<uint32_t>(buf.size() - 4);
    std::memcpy(buf.data(), &n, 4);
    return std::move(buf);
  }
};

// Reads fields of one frame; any overrun is a malformed frame.
struct Reader {
  std::string_view s;
  std::size_t pos = 0;
  void need(std::size_t n) const {
    if (s.size() - pos < n) throw std::runtime_error("truncated frame");
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(s[pos++]);
  }
  int64_t i64() {
    need(8);
    int64_t v;
    std::memcpy(&v, s.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str() {
    need(4);
    uint32_t n;
    std::memcpy(&n, s.data() + pos, 4);
    pos += 4;
    need(n);
    std::string out(s.substr(pos, n));
    pos += n;
    return out;
  }
};

std::string random_generation() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                      static_cast<uint64_t>(::getpid()));
  static const char* hex = "0123456789abcdef";
  std::string out;
  uint64_t v = rng();
  for (int i = 0; i < 16; ++i, v >>= 4) out += hex[v & 15];
  return out;
}

}  // namespace

std::string failure_key(const std::string& prefix) { return prefix + "failure"; }

KeyValueStore::~KeyValueStore() = default;

std::string encode_failure(const FailureNotice& n) { return std::to_string(n.code) + "|" + n.message; }

FailureNotice decode_failure(const std::string& value) {
  const auto bar = value.find('|');
  if (bar != std::string::npos && bar > 0 && bar < 4) {
    int code = 0;
    bool digits = true;
    for (std::size_t i = 0; i < bar; ++i) digits = digits && value[i] >= '0' && value[i] <= '9';
    if (digits) {
      code = std::stoi(value.substr(0, bar));
      return {code, value.substr(bar + 1)};
    }
  }
  return {static_cast<int>(ErrorCode::UNAVAILABLE), value};
}

// ---------------------------------------------------------------------------------------------
// Server.

struct StoreServer::Impl {
  struct Client {
    net::Fd fd;
    std::string in;
    std::string out;
    int rank = -1;
    bool monitor = false;
    bool greeted = false;
    // A request that waits for keys (GET, WAIT) or for every worker to be gone (GONE).
    uint8_t pending = 0;
    std::vector<std::string> keys;
    Clock::time_point deadline;
    bool closing = false;
  };

  Impl(const std::string& host, int port_, std::string job, std::vector<std::string> names_)
      : listener(net::listen_on(host, port_)),
        job_id(std::move(job)),
        generation(random_generation()),
        names(std::move(names_)),
        gone(names.size(), 0),
        bye_count(names.size(), -1),
        last_seen(names.size(), Clock::now()) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
      throw UnavailableError(str_cat("store server: pipe failed: ", std::strerror(errno)));
    wake_r.reset(fds[0]);
    wake_w.reset(fds[1]);
    prefix = job_id + "/" + generation + "/";
    thread = std::thread([this] { run(); });
  }

  ~Impl() {
    stop.store(true);
    const char c = 0;
    [[maybe_unused]] ssize_t n = ::write(wake_w.get(), &c, 1);
    thread.join();
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stop.load()) {
      fds.clear();
      fds.push_back({wake_r.get(), POLLIN, 0});
      fds.push_back({listener.get(), static_cast<short>(clients.size() < kMaxClients ? POLLIN : 0), 0});
      for (auto& c : clients)
        fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      const int rc = ::poll(fds.data(), fds.size(), next_timeout_ms());
      if (rc < 0 && errno != EINTR) {
        MIRRORED_LOG(error, "store server: poll failed: ", std::strerror(errno));
        return;
      }
      if (fds[1].revents & POLLIN) accept_clients();
      for (std::size_t i = 0; i + 2 < fds.size() && i < clients.size(); ++i) {
        Client& c = *clients[i];
        const short ev = fds[i + 2].revents;
        if (c.closing) continue;
        if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if (!c.closing && (ev & POLLOUT)) flush(c);
      }
      expire_pending();
      // Requests that arrived while an earlier one waited (never recursively: a client could
      // queue many).
      for (std::size_t i = 0; i < clients.size(); ++i) process(*clients[i]);
      reap();
    }
  }

  int next_timeout_ms() const {
    auto next = Clock::now() + std::chrono::seconds(1);
    for (const auto& c : clients)
      if (c->pending) next = std::min(next, c->deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
  }

  void accept_clients() {
    while (clients.size() < kMaxClients) {
      const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      net::set_nodelay(fd);
      auto c = std::make_unique<Client>();
      c->fd.reset(fd);
      clients.push_back(std::move(c));
    }
  }

  void read_from(Client& c) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.size() > kMaxFrame + 4) return close_client(c, "an oversized request");
        continue;
      }
      if (n == 0) return close_client(c, "");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return close_client(c, std::strerror(errno));
    }
    process(c);
  }

  void process(Client& c) {
    while (!c.closing && !c.pending && c.in.size() >= 4) {
      uint32_t len;
      std::memcpy(&len, c.in.data(), 4);
      if (len > kMaxFrame || len == 0) return close_client(c, "a malformed request");
      if (c.in.size() < 4 + std::size_t{len}) return;
      const std::string body = c.in.substr(4, len);
      c.in.erase(0, 4 + std::size_t{len});
      try {
        handle(c, Reader{body});
      } catch (const std::exception& e) {
        return close_client(c, str_cat("a malformed request (", e.what(), ")"));
      }
    }
  }

  void reply(Client& c, uint8_t status, Writer w = {}) {
    std::string body = std::move(w.buf);
    // Re-frame: [len][status][fields...]
    std::string frame(4, '\0');
    frame.push_back(static_cast<char>(status));
    frame.append(body, 4, std::string::npos);
    const auto n = static_cast<uint32_t>(frame.size() - 4);
    std::memcpy(frame.data(), &n, 4);
    c.out += frame;
    flush(c);
  }

  void flush(Client& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return close_client(c, std::strerror(errno));
    }
  }

  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!kv.count(k)) return false;
    return true;
  }
  bool all_gone() const {
    return std::all_of(gone.begin(), gone.end(), [](char g) { return g != 0; });
  }

  void handle(Client& c, Reader r) {
    const uint8_t op = r.u8();
    if (!c.greeted && op != kHello) throw std::runtime_error("no hello");
    if (c.monitor && c.rank >= 0) last_seen[static_cast<std::size_t>(c.rank)] = Clock::now();
    switch (op) {
      case kHello: {
        const std::string job = r.str();
        const int64_t rank = r.i64();
        const int64_t role = r.i64();
        if (job != job_id) {
          reply(c, kError, Writer().str(str_cat("this store serves job '", job_id, "', not '", job, "'")));
          c.closing = true;
          return;
        }
        if (rank < 0 || rank >= static_cast<int64_t>(names.size())) {
          reply(c, kError, Writer().str(str_cat("rank ", rank, " is out of range for ", names.size(), " workers")));
          c.closing = true;
          return;
        }
        c.greeted = true;
        c.rank = static_cast<int>(rank);
        c.monitor = role == 1;
        if (c.monitor) last_seen[static_cast<std::size_t>(rank)] = Clock::now();
        reply(c, kOk, Writer().str(generation));
        return;
      }
      case kSet: {
        std::string key = r.str();
        kv[key] = r.str();
        reply(c, kOk);
        wake_pending();
        return;
      }
      case kSetIfAbsent: {
        std::string key = r.str();
        std::string value = r.str();
        const bool set = kv.emplace(std::move(key), std::move(value)).second;
        reply(c, kOk, Writer().i64(set ? 1 : 0));
        if (set) wake_pending();
        return;
      }
      case kGet:
      case kWait: {
        std::vector<std::string> keys;
        const int64_t count = op == kGet ? 1 : r.i64();
        if (count < 0 || count > 100000) throw std::runtime_error("bad key count");
        for (int64_t i = 0; i < count; ++i) keys.push_back(r.str());
        const int64_t timeout_ms = r.i64();
        c.pending = op;
        c.keys = std::move(keys);
        c.deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, int64_t{1} << 40));
        try_complete(c);
        return;
      }
      case kBye: {
        const int64_t count = r.i64();
        const auto k = static_cast<std::size_t>(c.rank);
        bye_count[k] = count;
        gone[k] = 1;
        reply(c, kOk);
        wake_pending();
        return;
      }
      case kGone: {
        const int64_t timeout_ms = r.i64();
        c.pending = kGone;
        c.deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, int64_t{1} << 40));
        try_complete(c);
        return;
      }
      case kStale: {
        const auto threshold = std::chrono::milliseconds(std::max<int64_t>(0, r.i64()));
        Writer w;
        std::vector<int64_t> stale;
        for (std::size_t k = 0; k < names.size(); ++k)
          if (!gone[k] && Clock::now() - last_seen[k] > threshold) stale.push_back(static_cast<int64_t>(k));
        w.i64(static_cast<int64_t>(stale.size()));
        for (int64_t k : stale) w.i64(k);
        reply(c, kOk, std::move(w));
        return;
      }
      case kDeparted: {
        Writer w;
        int64_t n = 0;
        for (int64_t b : bye_count) n += b >= 0;
        w.i64(n);
        for (std::size_t k = 0; k < bye_count.size(); ++k)
          if (bye_count[k] >= 0) w.i64(static_cast<int64_t>(k)).i64(bye_count[k]);
        reply(c, kOk, std::move(w));
        return;
      }
      default: throw std::runtime_error("unknown request");
    }
  }

  // Answers a waiting request if it can be answered now.
  void try_complete(Client& c) {
    if (c.pending == kGet && kv.count(c.keys[0])) {
      c.pending = 0;
      reply(c, kOk, Writer().str(kv[c.keys[0]]));
    } else if (c.pending == kWait && has_all(c.keys)) {
      c.pending = 0;
      reply(c, kOk);
    } else if (c.pending == kGone && all_gone()) {
      c.pending = 0;
      reply(c, kOk);
    }
  }

  void wake_pending() {
    for (std::size_t i = 0; i < clients.size(); ++i) {
      Client& c = *clients[i];
      if (c.pending && !c.closing) try_complete(c);
    }
  }

  void expire_pending() {
    const auto now = Clock::now();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      Client& c = *clients[i];
      if (!c.pending || c.closing || now < c.deadline) continue;
      const uint8_t kind = c.pending;
      c.pending = 0;
      Writer w;
      if (kind == kWait) {
        std::vector<std::string> missing;
        for (const auto& k : c.keys)
          if (!kv.count(k)) missing.push_back(k);
        w.i64(static_cast<int64_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
      }
      reply(c, kTimeout, std::move(w));
    }
  }

  void close_client(Client& c, const std::string& why) {
    if (c.closing) return;
    c.closing = true;
    if (c.monitor && c.rank >= 0) {
      const auto k = static_cast<std::size_t>(c.rank);
      if (!gone[k]) {
        gone[k] = 1;
        FailureNotice n{static_cast<int>(ErrorCode::UNAVAILABLE),
                        str_cat(names[k], " is gone: its connection to the chief's store closed without a goodbye",
                                why.empty() ? "" : " (" + why + ")", " (the process died or was killed)")};
        MIRRORED_LOG(warn, "store server: ", n.message);
        kv.emplace(failure_key(prefix), encode_failure(n));
        // Answered after this client is marked closed, so the loop below cannot recurse into it.
        wake_pending();
      }
    }
  }

  void reap() {
    clients.erase(std::remove_if(clients.begin(), clients.end(),
                                 [](const std::unique_ptr<Client>& c) { return c->closing && c->out.empty(); }),
                  clients.end());
    // A closing client with unsent output (an error reply) gets one more try, then goes.
    for (auto& c : clients)
      if (c->closing) c->out.clear();
  }

  net::Fd listener;
  int port = 0;
  std::string job_id;
  std::string generation;
  std::string prefix;
  std::vector<std::string> names;
  std::vector<char> gone;
  std::vector<int64_t> bye_count;
  std::vector<Clock::time_point> last_seen;
  std::map<std::string, std::string> kv;
  std::vector<std::unique_ptr<Client>> clients;
  net::Fd wake_r, wake_w;
  std::atomic<bool> stop{false};
  std::thread thread;
};

StoreServer::StoreServer(const std::string& host, int port, std::string job_id, std::vector<std::string> worker_names)
    : impl_(std::make_unique<Impl>(host, port, std::move(job_id), std::move(worker_names))) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const noexcept { return impl_->port; }
const std::string& StoreServer::generation() const noexcept { return impl_->generation; }

// ---------------------------------------------------------------------------------------------
// Client.

TcpStoreClient::TcpStoreClient(const std::string& host, int port, const std::string& job_id, int rank, Role role,
                               double connect_timeout_s)
    : who_(str_cat("the chief's store at ", host, ":", port)) {
  fd_ = net::connect_until(host, port, net::deadline_after(connect_timeout_s), who_);
  int status = 0;
  const std::string body = request(Writer().u8(kHello).str(job_id).i64(rank).i64(role == Role::monitor ? 1 : 0).frame(),
                                   connect_timeout_s, &status);
  Reader r{body};
  if (status != kOk) throw FailedPreconditionError(str_cat(who_, " refused worker ", rank, ": ", r.str()));
  generation_ = r.str();
}

TcpStoreClient::~TcpStoreClient() = default;

std::string TcpStoreClient::request(const std::string& frame, double timeout_s, int* status) {
  std::lock_guard lock(mu_);
  if (broken_) std::rethrow_exception(broken_);
  const auto deadline = net::deadline_after(timeout_s + kAnswerSlackSeconds);
  try {
    net::send_all(fd_.get(), frame.data(), frame.size(), deadline, who_);
    uint32_t len = 0;
    net::recv_all(fd_.get(), &len, sizeof(len), deadline, who_);
    MIRRORED_ENFORCE(len >= 1 && len <= kMaxFrame, UnavailableError, who_, " sent a malformed answer");
    std::string body(len, '\0');
    net::recv_all(fd_.get(), body.data(), len, deadline, who_);
    *status = static_cast<uint8_t>(body[0]);
    return body.substr(1);
  } catch (...) {
    // The stream is out of step now: no later request may read this one's answer. The
    // connection stays open until the client goes away (the server takes a monitor connection
    // that closes without a goodbye for the worker's death).
    broken_ = std::current_exception();
    throw;
  }
}

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  int status = 0;
  request(Writer().u8(kSet).str(key).str(value).frame(), 0, &status);
}

bool TcpStoreClient::set_if_absent(const std::string& key, const std::string& value) {
  int status = 0;
  const std::string body = request(Writer().u8(kSetIfAbsent).str(key).str(value).frame(), 0, &status);
  return Reader{body}.i64() == 1;
}

std::optional<std::string> TcpStoreClient::get(const std::string& key, double timeout_s) {
  int status = 0;
  const auto ms = static_cast<int64_t>(timeout_s * 1000);
  const std::string body = request(Writer().u8(kGet).str(key).i64(ms).frame(), timeout_s, &status);
  if (status == kTimeout) return std::nullopt;
  return Reader{body}.str();
}

std::vector<std::string> TcpStoreClient::wait(const std::vector<std::string>& keys, double timeout_s) {
  Writer w;
  w.u8(kWait).i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.i64(static_cast<int64_t>(timeout_s * 1000));
  int status = 0;
  const std::string body = request(w.frame(), timeout_s, &status);
  std::vector<std::string> missing;
  if (status == kTimeout) {
    Reader r{body};
    const int64_t n = r.i64();
    for (int64_t i = 0; i < n; ++i) missing.push_back(r.str());
  }
  return missing;
}

void TcpStoreClient::bye(int64_t collectives) {
  int status = 0;
  request(Writer().u8(kBye).i64(collectives).frame(), 0, &status);
}

bool TcpStoreClient::wait_all_gone(double timeout_s) {
  int status = 0;
  request(Writer().u8(kGone).i64(static_cast<int64_t>(timeout_s * 1000)).frame(), timeout_s, &status);
  return status == kOk;
}

std::vector<int> TcpStoreClient::stale_workers(double threshold_s, double timeout_s) {
  int status = 0;
  const std::string body =
      request(Writer().u8(kStale).i64(static_cast<int64_t>(threshold_s * 1000)).frame(), timeout_s, &status);
  Reader r{body};
  std::vector<int> out(static_cast<std::size_t>(r.i64()));
  for (auto& k : out) k = static_cast<int>(r.i64());
  return out;
}

std::vector<std::pair<int, int64_t>> TcpStoreClient::departed(double timeout_s) {
  int status = 0;
  const std::string body = request(Writer().u8(kDeparted).frame(), timeout_s, &status);
  Reader r{body};
  std::vector<std::pair<int, int64_t>> out(static_cast<std::size_t>(r.i64()));
  for (auto& [k, n] : out) {
    k = static_cast<int>(r.i64());
    n = r.i64();
  }
  return out;
}

}  // namespace mirrored::detail::cluster
