#pragma once
// Helpers shared by the checkpoint file-format tests: raw file bytes and a fixture with a scratch
// folder.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fs_test_util.hpp"
#include "gtest_util.hpp"
#include "mirrored/checkpoint.hpp"
#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::testing {

namespace fs = std::filesystem;
using checkpoint::untyped;
using mirrored::testing::error_of;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A safetensors file: 8-byte little-endian length, `header` (not padded), `data`.
inline std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <class T>
std::string raw_bytes(const Tensor<T>& t) {
  return raw_bytes(t.to_vector());
}

/// What saves to `path` left beside it: temporary files (`<path>.tmp.*`) and the lock file, by name.
inline std::vector<std::string> save_leftovers(const std::string& path) {
  const fs::path p(path);
  const std::string temp = fs::path(detail::checkpoint_temp_prefix(path)).filename().string();
  const std::string lock = fs::path(detail::checkpoint_lock_path(path)).filename().string();
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(p.parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(temp, 0) == 0 || name == lock) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mirrored_ckpt_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    detail::set_checkpoint_fault_hook(nullptr);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

  /// A small checkpoint with two tensors, returning its path.
  std::string small_checkpoint() {
    const std::string p = file("small.safetensors");
    checkpoint::save_tensors(p, {{"a", untyped(Tensor<float>{1.0f, 2.0f})},
                                 {"b", untyped(Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}))}});
    return p;
  }

  std::string dir_;
};
}  // namespace mirrored::testing
