// The client of the chief's store (tcp_store.hpp); the server is in tcp_store.cpp.
#include <unistd.h>

#include "cluster/store/tcp_store.hpp"
#include "cluster/store/tcp_store_wire.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {

using namespace wire;

TcpStoreClient::TcpStoreClient(const std::string& host, int port, const std::string& job_id, int rank, Role role,
                               double connect_timeout_s, const std::vector<std::string>& cluster, double answer_slack_s)
    : who_(str_cat("the chief's store at ", host, ":", port)), answer_slack_s_(answer_slack_s) {
  fd_ = net::connect_until(host, port, net::deadline_after(connect_timeout_s), who_);
  char hostname[256] = {};
  ::gethostname(hostname, sizeof(hostname) - 1);
  Writer hello;
  hello.u8(kHello).str(job_id).i64(rank).i64(role == Role::monitor ? 1 : 0).i64(static_cast<int64_t>(cluster.size()));
  for (const auto& n : cluster) hello.str(n);
  hello.i64(static_cast<int64_t>(::getpid())).str(hostname);
  int status = 0;
  const std::string body = request(hello.frame(), connect_timeout_s, &status);
  Reader r{body};
  if (status == kMismatch) throw InvalidArgumentError(str_cat("MultiWorkerMirroredStrategy ", r.str()));
  if (status != kOk) throw FailedPreconditionError(str_cat(who_, " refused worker ", rank, ": ", r.str()));
  generation_ = r.str();
}

TcpStoreClient::~TcpStoreClient() = default;

std::string TcpStoreClient::request(const std::string& frame, double timeout_s, int* status) {
  std::lock_guard lock(mu_);
  if (broken_) std::rethrow_exception(broken_);
  const auto deadline = net::deadline_after(timeout_s + answer_slack_s_);
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
