#pragma once
// Test helper: what train_digits leaves behind, read back for bitwise comparisons
// (tests/cluster/test_resume.cpp, tests/cluster/test_real_launchers.cpp).

#include <map>
#include <string>
#include <vector>

#include <mirrored/checkpoint.hpp>

namespace mirrored::testing {

/// What the finished training saved: the path after "saved the finished training to " in
/// train_digits' output ("" when it did not say).
inline std::string final_checkpoint(const std::string& output) {
  const std::string key = "saved the finished training to ";
  const auto at = output.rfind(key);
  if (at == std::string::npos) return "";
  const auto end = output.find('\n', at);
  return output.substr(at + key.size(), end - at - key.size());
}

/// Every tensor of the safetensors file at `path` but the input iterators' positions (`input/…`),
/// as raw bytes by name.
inline std::map<std::string, std::vector<unsigned char>> model_and_optimizer(const std::string& path) {
  std::map<std::string, std::vector<unsigned char>> out;
  const auto ckpt = checkpoint::load(path);
  for (const auto& name : ckpt.names()) {
    if (name.rfind("input/", 0) == 0) continue;
    const auto& t = ckpt.at(name);
    const auto* p = static_cast<const unsigned char*>(t.data());
    out[name] = std::vector<unsigned char>(p, p + t.bytes());
  }
  return out;
}

}  // namespace mirrored::testing
