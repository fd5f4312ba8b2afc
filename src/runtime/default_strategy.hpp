#pragma once
// Private: the default strategy (one replica on CPU:0, run inline on the caller's thread).
#include <memory>

#include "mirrored/replica_context.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored::detail {

class DefaultStrategy final : public Strategy {
 public:
  DefaultStrategy();
  std::string name() const override { return "DefaultDistributionStrategy"; }
  ReplicaContext& default_context() { return context(0); }
};

DefaultStrategy& default_strategy();
/// True for the default replica context (valid on every thread, outside any scope).
bool is_default_context(const ReplicaContext* ctx) noexcept;

}  // namespace mirrored::detail
