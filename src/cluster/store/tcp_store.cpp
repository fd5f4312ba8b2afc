#include "cluster/store/tcp_store.hpp"
#include "cluster/store/tcp_store_wire.hpp"

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
using namespace wire;

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

std::string startup_error_key(const std::string& prefix) { return prefix + "startup-error"; }

namespace {

// "3 workers [worker 0 (a:1), worker 1 (b:1), chief 0 (c:1)]"
std::string describe_cluster(const std::vector<std::string>& names) {
  std::string out = str_cat(names.size(), names.size() == 1 ? " worker [" : " workers [");
  for (std::size_t i = 0; i < names.size(); ++i) out += str_cat(i ? ", " : "", names[i]);
  return out + "]";
}

}  // namespace

KeyValueStore::~KeyValueStore() = default;

FailureNotice lost_worker_notice(const std::string& name, double peer_timeout_s) {
  return {static_cast<int>(ErrorCode::UNAVAILABLE),
          str_cat(name, " is lost: no sign of life for ", peer_timeout_s,
                  " s (its host is down or cut off, or the process is stopped; MIRRORED_PEER_TIMEOUT_S)")};
}

FailureNotice unreachable_pair_notice(const std::string& a, const std::string& b, double peer_timeout_s) {
  return {static_cast<int>(ErrorCode::UNAVAILABLE),
          str_cat(a, " and ", b, " cannot reach each other: no heartbeat between them for ", peer_timeout_s,
                  " s, while both still reach the chief (a partition of the network; MIRRORED_PEER_TIMEOUT_S)")};
}

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
    int64_t pid = 0;
    std::string host;
    bool greeted = false;
    // A request that waits for keys (GET, WAIT) or for every worker to be gone (GONE).
    uint8_t pending = 0;
    std::vector<std::string> keys;
    Clock::time_point deadline;
    bool closing = false;
  };

  Impl(const std::string& host, int port_, std::string job, std::vector<std::string> names_, double peer_timeout_s_)
      : listener(net::listen_on(host, port_)),
        job_id(std::move(job)),
        generation(random_generation()),
        names(std::move(names_)),
        gone(names.size(), 0),
        bye_count(names.size(), -1),
        last_seen(names.size(), Clock::now()),
        peer_timeout_s(peer_timeout_s_),
        watched(names.size(), 0) {
    port = net::bound_port(listener.get());
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
      expire_silent();
      // Requests that arrived while an earlier one waited (never recursively: a client could
      // queue many).
      for (std::size_t i = 0; i < clients.size(); ++i) process(*clients[i]);
      reap();
    }
  }

  int next_timeout_ms() const {
    // A quarter second at most: silent workers are found within the peer timeout plus this.
    auto next = Clock::now() + std::chrono::milliseconds(250);
    for (const auto& c : clients)
      if (c->pending) next = std::min(next, c->deadline);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 250));
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
    if (c.monitor && c.rank >= 0) {
      // Watched from its first poll on: the worker polls only once it has joined (its start-up,
      // which waits for the others, is bounded by the start-up timeout instead).
      last_seen[static_cast<std::size_t>(c.rank)] = Clock::now();
      watched[static_cast<std::size_t>(c.rank)] = 1;
    }
    switch (op) {
      case kHello: {
        const std::string job = r.str();
        const int64_t rank = r.i64();
        const int64_t role = r.i64();
        std::vector<std::string> cluster(static_cast<std::size_t>(std::clamp<int64_t>(r.i64(), 0, 100000)));
        for (auto& n : cluster) n = r.str();
        const int64_t pid = r.i64();
        const std::string host = r.str();
        // A worker whose TF_CONFIG lists other workers than the chief's: its job id (derived from
        // that list by default) differs as well, but the list is what the user has to fix. Every
        // worker still starting up fails with the same message.
        if (!cluster.empty() && cluster != names) {
          const std::string who = rank >= 0 && rank < static_cast<int64_t>(cluster.size())
                                      ? cluster[static_cast<std::size_t>(rank)]
                                      : str_cat("the worker of task index ", rank);
          return refuse_at_startup(
              c, str_cat("start-up: the workers' TF_CONFIGs differ: ", who, " has a cluster of ",
                         describe_cluster(cluster), " but the chief, ", names[0], ", has ", describe_cluster(names)));
        }
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
        if (role == 1) {
          // One monitor per worker: a second one is a second process with the same task index.
          for (const auto& other : clients) {
            if (other.get() == &c || !other->greeted || !other->monitor || other->rank != rank || other->closing)
              continue;
            return refuse_at_startup(
                c, str_cat("start-up: two workers claim task index ", rank, " (", names[static_cast<std::size_t>(rank)],
                           "): process ", other->pid, " on host '", other->host, "' and process ", pid, " on host '",
                           host, "'; give every worker its own task.index in TF_CONFIG"));
          }
        }
        c.greeted = true;
        c.rank = static_cast<int>(rank);
        c.monitor = role == 1;
        c.pid = pid;
        c.host = host;
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

  // Refuses a worker configured differently from the others, and publishes why for every worker
  // still waiting for the others at start-up (they would otherwise wait for the whole timeout).
  void refuse_at_startup(Client& c, const std::string& why) {
    reply(c, kMismatch, Writer().str(why));
    c.closing = true;
    if (kv.emplace(startup_error_key(prefix), why).second) wake_pending();
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

  // Publishes a worker whose monitor has been silent for the peer timeout as lost, and drops its
  // connections: they would never close (its host is gone or cut off), and the chief must not
  // wait for them. The chief's own monitor runs in this process: if it is silent, so is this
  // thread.
  void expire_silent() {
    const auto now = Clock::now();
    const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(peer_timeout_s));
    for (std::size_t k = 1; k < names.size(); ++k) {
      if (!watched[k] || gone[k] || now - last_seen[k] <= limit) continue;
      gone[k] = 1;
      const FailureNotice n = lost_worker_notice(names[k], peer_timeout_s);
      MIRRORED_LOG(warn, "store server: ", n.message);
      kv.emplace(failure_key(prefix), encode_failure(n));
      for (auto& c : clients)
        if (c->rank == static_cast<int>(k)) c->closing = true;
      wake_pending();
    }
  }

  void close_client(Client& c, const std::string& why) {
    if (c.closing) return;
    c.closing = true;
    if (c.monitor && c.rank >= 0) {
      const auto k = static_cast<std::size_t>(c.rank);
      // The chief's own monitor closes only while the chief lives (this server dies with its
      // process), so its closing is the chief leaving, never its death. A goodbye wait that
      // arrived first (on the chief's other connection) may now be answered.
      if (k == 0 && !gone[k]) {
        gone[k] = 1;
        wake_pending();
      }
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
    workers_connected.store(
        std::count_if(clients.begin(), clients.end(), [](const std::unique_ptr<Client>& c) { return c->greeted; }));
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
  double peer_timeout_s;
  std::vector<char> watched;  // the worker's monitor joined: its silence counts
  std::map<std::string, std::string> kv;
  std::vector<std::unique_ptr<Client>> clients;
  net::Fd wake_r, wake_w;
  std::atomic<bool> stop{false};
  std::atomic<std::ptrdiff_t> workers_connected{0};
  std::thread thread;
};

StoreServer::StoreServer(const std::string& host, int port, std::string job_id, std::vector<std::string> worker_names,
                         double peer_timeout_s)
    : impl_(std::make_unique<Impl>(host, port, std::move(job_id), std::move(worker_names), peer_timeout_s)) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const noexcept { return impl_->port; }
const std::string& StoreServer::generation() const noexcept { return impl_->generation; }

bool StoreServer::wait_until_disconnected(double timeout_s) {
  const auto deadline = net::deadline_after(timeout_s);
  while (impl_->workers_connected.load() > 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace mirrored::detail::cluster
