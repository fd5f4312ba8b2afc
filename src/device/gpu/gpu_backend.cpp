// Naming GPU call sites, and the GPUs a sticky error made unusable.
#include "device/gpu/gpu_backend.hpp"

#include <atomic>
#include <map>
#include <mutex>

#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

struct Unusable {
  std::atomic<bool> any{false};  // checked on every GPU call: one load when no GPU failed
  std::mutex mu;
  std::map<int, std::string> reasons;  // physical GPU -> the sticky error
};
Unusable& unusable() {
  static Unusable* u = new Unusable;  // used by backends that outlive static destruction
  return *u;
}

}  // namespace

std::string describe_gpu_call_site(const Device& logical, int physical) {
  return describe_gpu_call_site(logical, physical, calling_replica_id());
}

std::string describe_gpu_call_site(const Device& logical, int physical, int replica) {
  std::string where = logical.short_name() + " (physical GPU " + std::to_string(physical) + ")";
  if (replica >= 0) where += ", replica " + std::to_string(replica);
  return where;
}

void mark_gpu_unusable(int physical, const std::string& what) noexcept {
  auto& u = unusable();
  try {
    std::lock_guard lock(u.mu);
    if (!u.reasons.emplace(physical, what).second) return;
  } catch (...) {
    // No memory for the reason: the flag below still refuses the device.
  }
  u.any.store(true, std::memory_order_release);
  MIRRORED_LOG(error, "physical GPU ", physical, " is unusable until it is reset: ", what);
}

void check_gpu_usable(const Device& logical, int physical) {
  auto& u = unusable();
  if (!u.any.load(std::memory_order_acquire)) return;
  std::string reason;
  {
    std::lock_guard lock(u.mu);
    auto it = u.reasons.find(physical);
    if (it == u.reasons.end()) return;
    reason = it->second;
  }
  throw FailedPreconditionError(str_cat(describe_gpu_call_site(logical, physical),
                                        " cannot be used: an earlier call on physical GPU ", physical,
                                        " failed with a sticky error (", reason,
                                        "), which leaves the device unusable; the device must be reset (restart the "
                                        "process) before it can run work again"));
}

}  // namespace mirrored::detail
