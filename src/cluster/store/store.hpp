#pragma once
// Private: the key/value store through which the workers of a job meet (the control plane):
// rendezvous addresses, the NCCL unique id, shared-memory names, the first failure, and the
// shutdown barrier. Two implementations: the chief's TCP store (tcp_store.hpp, the role of
// c10d's TCPStore; Gloo has none) and a directory on a shared file system (file_store.cpp).
// Every call is bounded by a deadline.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mirrored::detail::cluster {

/// A key/value store shared by every worker of a job. Thread-safe.
class KeyValueStore {
 public:
  virtual ~KeyValueStore();
  /// Sets `key` (overwriting).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Sets `key` only if it has no value yet; true if this call set it (the first writer wins).
  virtual bool set_if_absent(const std::string& key, const std::string& value) = 0;
  /// The value of `key`, waiting up to `timeout_s` for it to appear; nullopt if it did not.
  virtual std::optional<std::string> get(const std::string& key, double timeout_s) = 0;
  /// Waits up to `timeout_s` until every key has a value; returns the keys still missing.
  virtual std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s) = 0;
  /// Where the store is, for messages ("the chief's store at 10.0.0.1:2222").
  virtual std::string describe() const = 0;
};

/// A store in directory `path` (one file per key, written atomically; temporary files are
/// created exclusively and never through symbolic links). \throws InvalidArgumentError when
/// `path` is not a directory.
std::unique_ptr<KeyValueStore> make_file_store(const std::string& path);

}  // namespace mirrored::detail::cluster

namespace mirrored::detail::cluster {

/// The first failure of a job, as published through the store so that every worker reports the
/// same cause: the error code (UNAVAILABLE, DEADLINE_EXCEEDED, FAILED_PRECONDITION) and message.
struct FailureNotice {
  int code = 0;  // an ErrorCode value
  std::string message;
};
std::string encode_failure(const FailureNotice& notice);
/// \throws nothing: a malformed value decodes as UNAVAILABLE with the raw text.
FailureNotice decode_failure(const std::string& value);

/// The failure of a worker lost without a closed connection (its host down or partitioned, its
/// process stopped): one text, whoever finds it first (the chief's store, or a worker whose
/// neighbour went silent), so that every worker reports the same cause. `name` is the worker as
/// messages name it ("worker 2 (198.51.100.12:2222)").
FailureNotice lost_worker_notice(const std::string& name, double peer_timeout_s);
/// The failure of two workers that each reach the chief's store but not each other.
FailureNotice unreachable_pair_notice(const std::string& a, const std::string& b, double peer_timeout_s);

}  // namespace mirrored::detail::cluster
