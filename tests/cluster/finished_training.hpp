#pragma once
// What an example program's fault-tolerant run saved (train_digits, fashion_mnist): the path it
// prints and the checkpoint's tensors, to compare an interrupted and resumed run with an
// uninterrupted one bit for bit.
#include <map>
#include <string>
#include <vector>

#include <mirrored/checkpoint.hpp>

namespace mirrored::testing {

/// The path after "saved the finished training to " in a program's output ("" if absent).
inline std::string finished_checkpoint(const std::string& output) {
  const std::string key = "saved the finished training to ";
  const auto at = output.rfind(key);
  if (at == std::string::npos) return "";
  const auto end = output.find('\n', at);
  return output.substr(at + key.size(), end - at - key.size());
}

/// Every tensor of the checkpoint at `path` but the input iterators' positions, as raw bytes.
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
