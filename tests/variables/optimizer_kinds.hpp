#pragma once
// The built-in optimizers' update kinds as the optimizer tests name them, the slots each keeps, a
// factory, and the bitwise comparison the tests apply to what they train.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mirrored/optimizers.hpp"

namespace mirrored::testing {

enum class Kind { sgd, momentum, nesterov, adam, adamw };

inline std::string kind_name(Kind k) {
  switch (k) {
    case Kind::sgd: return "sgd";
    case Kind::momentum: return "momentum";
    case Kind::nesterov: return "nesterov";
    case Kind::adam: return "adam";
    case Kind::adamw: return "adamw";
  }
  return "?";
}

inline std::vector<std::string> slot_names(Kind k) {
  if (k == Kind::sgd) return {};
  if (k == Kind::momentum || k == Kind::nesterov) return {"momentum"};
  return {"m", "v"};
}

/// Whether two lists of float buffers (weights, slots) are equal bit for bit.
inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size() ||
        (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0))
      return false;
  }
  return true;
}

/// The SGD family's rates (Adam and AdamW use learning rate 0.01, weight decay 0.01).
struct SgdRates {
  double learning_rate = 0.01;
  double momentum = 0.9;
};

/// A built-in optimizer of kind `k`, its state sharded or not.
template <class T>
std::unique_ptr<optimizers::Optimizer<T>> make_optimizer(Kind k, bool sharded, SgdRates sgd = {}) {
  switch (k) {
    case Kind::sgd:
      return std::make_unique<optimizers::SGD<T>>(
          optimizers::SGDOptions{.learning_rate = sgd.learning_rate, .shard_optimizer_state = sharded});
    case Kind::momentum:
      return std::make_unique<optimizers::SGD<T>>(optimizers::SGDOptions{
          .learning_rate = sgd.learning_rate, .momentum = sgd.momentum, .shard_optimizer_state = sharded});
    case Kind::nesterov:
      return std::make_unique<optimizers::SGD<T>>(optimizers::SGDOptions{.learning_rate = sgd.learning_rate,
                                                                         .momentum = sgd.momentum,
                                                                         .nesterov = true,
                                                                         .shard_optimizer_state = sharded});
    case Kind::adam:
      return std::make_unique<optimizers::Adam<T>>(
          optimizers::AdamOptions{.learning_rate = 0.01, .shard_optimizer_state = sharded});
    case Kind::adamw:
      return std::make_unique<optimizers::AdamW<T>>(
          optimizers::AdamWOptions{.learning_rate = 0.01, .weight_decay = 0.01, .shard_optimizer_state = sharded});
  }
  return nullptr;
}

}  // namespace mirrored::testing
