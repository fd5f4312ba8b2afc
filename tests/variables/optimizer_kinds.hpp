#pragma once
// The built-in optimizers' update kinds as the optimizer tests name them, and the slots each keeps.
#include <string>
#include <vector>

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

}  // namespace mirrored::testing
