#pragma once
// The built-in optimizers' update kinds as the optimizer tests name them, the slots each keeps, a
// factory, and the bitwise comparison the tests apply to what they train.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mirrored/optimizers.hpp"

namespace mirrored::testing {

enum class Kind {
  sgd,
  momentum,
  nesterov,
  adam,
  adamw,
  rmsprop,
  rmsprop_momentum,
  rmsprop_centered,
  rmsprop_centered_momentum,
  adagrad
};

/// Every kind (the cheap host tests run them all).
inline const std::vector<Kind> kAllKinds = {Kind::sgd,
                                            Kind::momentum,
                                            Kind::nesterov,
                                            Kind::adam,
                                            Kind::adamw,
                                            Kind::rmsprop,
                                            Kind::rmsprop_momentum,
                                            Kind::rmsprop_centered,
                                            Kind::rmsprop_centered_momentum,
                                            Kind::adagrad};

/// RMSprop's and Adagrad's kinds that the heavier suites add to the first five: RMSprop with all
/// three slots, and Adagrad, whose slot starts at a value other than zero.
inline const std::vector<Kind> kSlotRichKinds = {Kind::rmsprop_centered_momentum, Kind::adagrad};

inline std::string kind_name(Kind k) {
  switch (k) {
    case Kind::sgd: return "sgd";
    case Kind::momentum: return "momentum";
    case Kind::nesterov: return "nesterov";
    case Kind::adam: return "adam";
    case Kind::adamw: return "adamw";
    case Kind::rmsprop: return "rmsprop";
    case Kind::rmsprop_momentum: return "rmsprop_momentum";
    case Kind::rmsprop_centered: return "rmsprop_centered";
    case Kind::rmsprop_centered_momentum: return "rmsprop_centered_momentum";
    case Kind::adagrad: return "adagrad";
  }
  return "?";
}

inline std::vector<std::string> slot_names(Kind k) {
  if (k == Kind::sgd) return {};
  if (k == Kind::momentum || k == Kind::nesterov) return {"momentum"};
  if (k == Kind::rmsprop) return {"velocity"};
  if (k == Kind::rmsprop_momentum) return {"velocity", "momentum"};
  if (k == Kind::rmsprop_centered) return {"velocity", "average_gradient"};
  if (k == Kind::rmsprop_centered_momentum) return {"velocity", "momentum", "average_gradient"};
  if (k == Kind::adagrad) return {"accumulator"};
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

/// The SGD family's rates (Adam and AdamW use learning rate 0.01, weight decay 0.01; RMSprop
/// learning rate 0.01, rho 0.9, momentum 0.9 where it has momentum; Adagrad learning rate 0.1 and
/// Keras' initial accumulator 0.1).
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
    case Kind::rmsprop:
    case Kind::rmsprop_momentum:
    case Kind::rmsprop_centered:
    case Kind::rmsprop_centered_momentum:
      return std::make_unique<optimizers::RMSprop<T>>(optimizers::RMSpropOptions{
          .learning_rate = 0.01,
          .momentum = (k == Kind::rmsprop_momentum || k == Kind::rmsprop_centered_momentum) ? 0.9 : 0.0,
          .centered = k == Kind::rmsprop_centered || k == Kind::rmsprop_centered_momentum,
          .shard_optimizer_state = sharded});
    case Kind::adagrad:
      return std::make_unique<optimizers::Adagrad<T>>(
          optimizers::AdagradOptions{.learning_rate = 0.1, .shard_optimizer_state = sharded});
  }
  return nullptr;
}

}  // namespace mirrored::testing
