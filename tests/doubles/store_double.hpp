#pragma once
// Test double: an in-memory KeyValueStore shared by the handles made from one `MemoryStoreState`,
// with faults injected on chosen calls — the k-th call of an operation on keys containing a given
// text throws a given error, or waits out its timeout as though the key never appeared.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/store/store.hpp"

namespace mirrored::testing {

/// One store's keys, shared by every handle.
struct MemoryStoreState {
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::string> values;

  void put(const std::string& key, const std::string& value) {
    {
      std::lock_guard lock(mu);
      values[key] = value;
    }
    changed.notify_all();
  }
  std::optional<std::string> peek(const std::string& key) {
    std::lock_guard lock(mu);
    auto it = values.find(key);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
};

/// A fault: the `nth` call (1-based) of `op` ("set", "set_if_absent", "get", "wait") on a key
/// containing `key_part` throws `error`, or, without one, waits out its timeout and finds nothing.
struct StoreFault {
  std::string op;
  std::string key_part;
  int nth = 1;
  std::exception_ptr error;
};

class MemoryStore : public detail::cluster::KeyValueStore {
 public:
  explicit MemoryStore(std::shared_ptr<MemoryStoreState> state, std::vector<StoreFault> faults = {})
      : state_(std::move(state)), faults_(std::move(faults)), seen_(faults_.size(), 0) {}

  void set(const std::string& key, const std::string& value) override {
    if (faulty("set", key)) return;
    state_->put(key, value);
  }
  bool set_if_absent(const std::string& key, const std::string& value) override {
    if (faulty("set_if_absent", key)) return false;
    {
      std::lock_guard lock(state_->mu);
      if (!state_->values.emplace(key, value).second) return false;
    }
    state_->changed.notify_all();
    return true;
  }
  std::optional<std::string> get(const std::string& key, double timeout_s) override {
    if (faulty("get", key)) {
      wait_out(timeout_s);
      return std::nullopt;
    }
    std::unique_lock lock(state_->mu);
    state_->changed.wait_for(lock, seconds(timeout_s), [&] { return state_->values.count(key) > 0; });
    auto it = state_->values.find(key);
    if (it == state_->values.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s) override {
    for (const auto& key : keys) {
      if (faulty("wait", key)) {
        wait_out(timeout_s);
        return keys;
      }
    }
    auto missing = [&] {
      std::vector<std::string> out;
      for (const auto& key : keys)
        if (!state_->values.count(key)) out.push_back(key);
      return out;
    };
    std::unique_lock lock(state_->mu);
    state_->changed.wait_for(lock, seconds(timeout_s), [&] { return missing().empty(); });
    return missing();
  }
  std::string describe() const override { return "the test's memory store"; }

 private:
  static std::chrono::duration<double> seconds(double s) { return std::chrono::duration<double>(s); }
  static void wait_out(double timeout_s) { std::this_thread::sleep_for(seconds(timeout_s)); }

  // True when this call is a fault that times out; throws when it is one that fails.
  bool faulty(const char* op, const std::string& key) {
    std::exception_ptr error;
    bool times_out = false;
    {
      std::lock_guard lock(mu_);
      for (std::size_t f = 0; f < faults_.size(); ++f) {
        const auto& fault = faults_[f];
        if (fault.op != op || key.find(fault.key_part) == std::string::npos) continue;
        if (++seen_[f] != fault.nth) continue;
        if (fault.error)
          error = fault.error;
        else
          times_out = true;
      }
    }
    if (error) std::rethrow_exception(error);
    return times_out;
  }

  std::shared_ptr<MemoryStoreState> state_;
  std::mutex mu_;
  std::vector<StoreFault> faults_;
  std::vector<int> seen_;
};

}  // namespace mirrored::testing
