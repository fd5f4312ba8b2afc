#pragma once
// Helpers of the input-pipeline tests (tests/test_data_*.cpp): collect what a dataset or a
// distributed dataset yields as plain vectors, so tests compare exact contents on the main thread.

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mirrored/mirrored.hpp>
#include <string>
#include <vector>

namespace mirrored::testing {

using Rows = std::vector<int64_t>;
/// steps[k][r] = the values replica r got in step k.
using Steps = std::vector<std::vector<Rows>>;

/// Every element of a dataset of int64 tensors, flattened.
template <class Ds>
std::vector<Rows> collect(const Ds& ds) {
  std::vector<Rows> out;
  for (const auto& t : ds) out.push_back(t.to_vector());
  return out;
}

/// What each replica received in each step of one pass.
template <class E>
Steps collect_steps(const DistributedDataset<E>& dd) {
  Steps out;
  for (const PerReplica<E>& step : dd) {
    std::vector<Rows> replicas;
    for (const auto& t : step.values()) replicas.push_back(t.to_vector());
    out.push_back(replicas);
  }
  return out;
}

/// The CPU devices "CPU:first" … "CPU:first+n-1".
inline std::vector<Device> cpu_devices(int n, int first = 0) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.emplace_back(DeviceType::CPU, first + i);
  return out;
}

/// A fresh temporary directory, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("mirrored_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// Writes `bytes` to `name` and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  /// Writes int64 values as 8-byte records (host byte order) and returns the path.
  std::string write_int64s(const std::string& name, const std::vector<int64_t>& values) const {
    return write(name, std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// An 8-byte record as an int64 scalar.
inline Tensor<int64_t> record_to_int64(const Tensor<uint8_t>& record) {
  int64_t v = 0;
  std::memcpy(&v, record.data(), sizeof v);
  return Tensor<int64_t>::scalar(v);
}

}  // namespace mirrored::testing
