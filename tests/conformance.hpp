#pragma once
// Conformance scenarios: the same programs run on any set of replica devices (and any
// cross-device ops) and record every result they produce — dtype, shape, raw bytes, and whether
// it landed on the device it should. Comparing the record of a GPU run with that of a CPU run of
// the same replica count checks the GPU backend and the GPU collectives bit for bit.
//
// Inputs are integers or dyadic fractions, so that every sum is exact in any order: results must
// then agree bitwise whatever the reduction order of the ops (NCCL's ring, hierarchical copy). The
// one scenario whose values need the fixed replica order (`ordered_sums`) is only compared between
// order-preserving ops.
//
// Replica functions never call gtest; recording and comparing happen on the test thread.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <mirrored/mirrored.hpp>
#include <mirrored/strategy_extended.hpp>

namespace mirrored::conformance {

struct Entry {
  std::string name;
  std::string dtype;
  Shape shape;
  std::vector<unsigned char> bytes;
  bool placed = true;  // on the device it should be on
};
using Record = std::vector<Entry>;

class Recorder {
 public:
  /// Records `t`; `expected` is where it should live (nullopt: anywhere).
  template <class T>
  void tensor(const std::string& name, const Tensor<T>& t, std::optional<Device> expected = std::nullopt) {
    Entry e;
    e.name = name;
    e.dtype = dtype_name(dtype_of<T>());
    e.shape = t.shape();
    const std::vector<T> v = t.to_vector();
    e.bytes.resize(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
    // Host memory is one place, whatever CPU:k a tensor names.
    if (expected) e.placed = t.device() == *expected || (t.device().is_host() && expected->is_host());
    rec_.push_back(std::move(e));
  }
  /// Records a number.
  template <class S>
  void number(const std::string& name, S value) {
    tensor(name, Tensor<detail::scalar_element_t<S>>::scalar(static_cast<detail::scalar_element_t<S>>(value)));
  }
  /// Records that something happened the way it should (e.g. the right error).
  void fact(const std::string& name, bool ok) {
    Entry e;
    e.name = name;
    e.dtype = ok ? "true" : "false";
    rec_.push_back(std::move(e));
  }
  Record take() { return std::move(rec_); }

 private:
  Record rec_;
};

inline std::string describe(const Entry& e) {
  std::ostringstream os;
  os << e.name << " dtype=" << e.dtype << " shape=" << detail::format_shape(e.shape) << " bytes=" << e.bytes.size()
     << (e.placed ? "" : " (on the wrong device)");
  return os.str();
}

/// EXPECTs that `actual` equals `expected` entry by entry, bit for bit, and that every tensor of
/// `actual` is on the device it should be.
inline void expect_same(const Record& expected, const Record& actual, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what << ": different number of results";
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Entry& a = actual[i];
    const Entry& e = expected[i];
    EXPECT_EQ(a.name, e.name) << what;
    EXPECT_TRUE(a.placed) << what << ": " << describe(a);
    EXPECT_EQ(a.dtype, e.dtype) << what << ": " << e.name;
    EXPECT_EQ(a.shape, e.shape) << what << ": " << e.name;
    if (a.bytes != e.bytes) {
      std::size_t at = 0;
      while (at < a.bytes.size() && at < e.bytes.size() && a.bytes[at] == e.bytes[at]) ++at;
      ADD_FAILURE() << what << ": " << e.name << " differs from byte " << at << " on (" << describe(a) << " vs "
                    << describe(e) << ")";
    }
  }
}

// Scenarios (tests/conformance.cpp, compiled once into mirrored_test_conformance).

std::vector<Device> parse_all(const std::vector<std::string>& specs);

/// Element-wise ops, fills, casts and copies on device `spec`.
Record tensor_ops(const std::string& spec);

Record collectives(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops = nullptr);

/// Sums whose value depends on the order: equal across devices only for ops that sum in replica
/// order (the default ones).
Record ordered_sums(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops = nullptr);

Record reduce_and_gather(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops = nullptr);

Record variables(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops = nullptr);

/// The distributed_input scenario's data: kInputRows rows of kInputWidth floats, row i column j
/// (i * kInputWidth + j) % 4093. A batch of 32 rows is 4 MiB.
inline constexpr int64_t kInputRows = 72, kInputWidth = 32768;

Record distributed_input(const std::vector<std::string>& specs);

}  // namespace mirrored::conformance
