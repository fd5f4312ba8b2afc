#pragma once
// The installed Fashion-MNIST for the fashion tests: its first examples, loaded once per process.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "fashion/fashion_data.hpp"

namespace fashion::testing {

/// Whether Debian's dataset-fashion-mnist (or the build's MIRRORED_FASHION_MNIST_DIR) is there.
inline bool have_fashion_mnist() {
  return std::filesystem::exists(idx_path(default_fashion_mnist_dir(), "train-images-idx3-ubyte"));
}

/// The first `train` and `test` examples.
inline const FashionMnist& fashion_subset(int64_t train, int64_t test) {
  static std::map<std::pair<int64_t, int64_t>, FashionMnist> cache;
  auto [it, fresh] = cache.try_emplace({train, test});
  if (fresh) it->second = load_fashion_mnist(default_fashion_mnist_dir(), train, test);
  return it->second;
}

}  // namespace fashion::testing

/// Skips the test when the data set is not installed, saying why.
#define FASHION_REQUIRE_DATA()                                                         \
  if (!::fashion::testing::have_fashion_mnist())                                       \
  GTEST_SKIP() << "Fashion-MNIST is not in " << ::fashion::default_fashion_mnist_dir() \
               << " (Debian's dataset-fashion-mnist; scripts/install-deps.sh installs it)"
