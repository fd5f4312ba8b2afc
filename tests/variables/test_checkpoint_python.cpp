// Interoperability with Python's `safetensors` package (skipped when it is not installed).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "variables/checkpoint_test_util.hpp"

namespace mirrored {
namespace {

using namespace mirrored::testing;  // NOLINT: the checkpoint test helpers
using ::testing::AllOf;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Python's safetensors package
// ---------------------------------------------------------------------------------------------

/// A Python interpreter that has `safetensors` and `numpy`, or "" when there is none.
std::string python_with_safetensors() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string cmd = std::string(py) + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

TEST_F(CheckpointFormat, PythonSafetensorsLoadsOurFiles) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";

  const std::string p = file("for_python.safetensors");
  checkpoint::save_tensors(
      p,
      {{"dense/kernel", untyped(Tensor<float>::from_vector({0.5f, -1.25f, 3.0f, 1e-3f, 2.0f, -0.0f}, {2, 3}))},
       {"f64", untyped(Tensor<double>::from_vector({0.1, -2.5, 1e300}, {3}))},
       {"i32", untyped(Tensor<int32_t>::from_vector({-2147483647 - 1, 0, 2147483647}, {3, 1}))},
       {"i64", untyped(Tensor<int64_t>::from_vector({-5, 4000000000LL}, {2}))},
       {"u8", untyped(Tensor<uint8_t>::from_vector({0, 7, 255}, {1, 3}))},
       {"scalar", untyped(Tensor<float>::scalar(6.5f))},
       {"empty", untyped(Tensor<float>::zeros({0, 4}))}},
      {{"step", "12"}});

  const std::string script = file("check.py");
  write_file(script, R"PY(
import sys, zlib
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

path = sys.argv[1]
got = load_file(path)
want = {
    "dense/kernel": np.array([[0.5, -1.25, 3.0], [1e-3, 2.0, -0.0]], dtype=np.float32),
    "f64": np.array([0.1, -2.5, 1e300], dtype=np.float64),
    "i32": np.array([[-2147483648], [0], [2147483647]], dtype=np.int32),
    "i64": np.array([-5, 4000000000], dtype=np.int64),
    "u8": np.array([[0, 7, 255]], dtype=np.uint8),
    "scalar": np.array(6.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
ok = sorted(got) == sorted(want)
if not ok:
    print("names:", sorted(got))
for k, w in want.items():
    g = got.get(k)
    if g is None or g.dtype != w.dtype or g.shape != w.shape or g.tobytes() != w.tobytes():
        print("mismatch", k, repr(g), repr(w))
        ok = False
with safe_open(path, framework="np") as f:
    meta = f.metadata()
if meta.get("step") != "12" or meta.get("mirrored.format") != "1":
    print("metadata", meta)
    ok = False
# The checksum is zlib's crc32 of the data section.
raw = open(path, "rb").read()
n = int.from_bytes(raw[:8], "little")
if meta.get("mirrored.checksum") != "crc32:%08x" % zlib.crc32(raw[8 + n:]):
    print("checksum", meta.get("mirrored.checksum"), "%08x" % zlib.crc32(raw[8 + n:]))
    ok = False
print("python safetensors: OK" if ok else "python safetensors: FAILED")
sys.exit(0 if ok else 1)
)PY");
  const std::string cmd = py + " " + script + " " + p + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(CheckpointFormat, WeLoadFilesWrittenByPythonSafetensors) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";

  const std::string p = file("from_python.safetensors");
  const std::string script = file("write.py");
  write_file(script, R"PY(
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "w": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5,
    "b": np.array([1, -2], dtype=np.int64),
    "u": np.array(200, dtype=np.uint8),
    "d": np.array([0.1], dtype=np.float64),
    "i": np.array([[7]], dtype=np.int32),
}, sys.argv[1], metadata={"origin": "python"})
)PY");
  const std::string cmd = py + " " + script + " " + p + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  EXPECT_THAT(error_of<InvalidArgumentError>([&] { checkpoint::load(p); }), HasSubstr("no 'mirrored.checksum'"));
  const auto ck = checkpoint::load(p, {.require_checksum = false});
  EXPECT_EQ(ck.get<float>("w", {2, 3}).to_vector(), (std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f}));
  EXPECT_EQ(ck.get<int64_t>("b", {2}).to_vector(), (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(ck.get<uint8_t>("u", {}).item(), 200);
  EXPECT_EQ(ck.get<double>("d", {1}).item(), 0.1);
  EXPECT_EQ(ck.get<int32_t>("i", {1, 1}).item(), 7);
  EXPECT_EQ(ck.metadata().at("origin"), "python");
}

TEST_F(CheckpointFormat, Float16FilesInteroperateWithPythonSafetensors) {
  const std::string py = python_with_safetensors();
  if (py.empty()) GTEST_SKIP() << "python3 with the safetensors and numpy packages is not installed";

  // Python writes F16 (numpy's float16), we load it bit-exact.
  const std::string from_python = file("f16_from_python.safetensors");
  const std::string write = file("write_f16.py");
  write_file(write, R"PY(
import sys
import numpy as np
from safetensors.numpy import save_file
bits = np.array([0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x3555], dtype=np.uint16)
save_file({"h": bits.view(np.float16).reshape(7, 1), "f": np.array([1.5], dtype=np.float32)}, sys.argv[1])
)PY");
  std::string cmd = py + " " + write + " " + from_python + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto ck = checkpoint::load(from_python, {.require_checksum = false});
  std::vector<std::uint16_t> bits;
  for (float16 h : ck.get<float16>("h", {7, 1}).to_vector()) bits.push_back(h.bits());
  EXPECT_EQ(bits, (std::vector<std::uint16_t>{0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x3555}));
  EXPECT_EQ(ck.get<float>("f", {1}).item(), 1.5f);

  // We write F16, Python reads the same values.
  const std::string for_python = file("f16_for_python.safetensors");
  checkpoint::save_tensors(
      for_python,
      {{"h", untyped(Tensor<float16>::from_vector({float16(0.1f), float16(-65504.0f), float16(2049.0f)}, {3}))}});
  const std::string check = file("check_f16.py");
  write_file(check, R"PY(
import sys
import numpy as np
from safetensors.numpy import load_file
got = load_file(sys.argv[1])["h"]
want = np.array([0.1, -65504, 2049], dtype=np.float16)
ok = got.dtype == np.float16 and got.shape == (3,) and got.tobytes() == want.tobytes()
print("python safetensors F16: OK" if ok else "python safetensors F16: FAILED %r" % (got,))
sys.exit(0 if ok else 1)
)PY");
  cmd = py + " " + check + " " + for_python + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace mirrored
