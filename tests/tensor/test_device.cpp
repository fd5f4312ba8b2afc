// Unit tests for device names (docs/api.md §1): parsing, canonical forms, discovery, and the
// device checks MirroredStrategy's constructor makes.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "gtest_util.hpp"
#include "mirrored/device.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/mirrored_strategy.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Device::parse — accepted spellings
// ---------------------------------------------------------------------------------------------

struct ParseCase {
  std::string spec;
  std::string canonical;
  std::string job;
  int replica;
  int task;
  DeviceType type;
  int index;
  std::string short_name;
};

void PrintTo(const ParseCase& c, std::ostream* os) { *os << "'" << c.spec << "'"; }

class DeviceParseTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(DeviceParseTest, ParsesToCanonicalForm) {
  const ParseCase& c = GetParam();
  const Device d = Device::parse(c.spec);
  EXPECT_EQ(d.to_string(), c.canonical);
  EXPECT_EQ(d.job(), c.job);
  EXPECT_EQ(d.replica(), c.replica);
  EXPECT_EQ(d.task(), c.task);
  EXPECT_EQ(d.type(), c.type);
  EXPECT_EQ(d.index(), c.index);
  EXPECT_EQ(d.short_name(), c.short_name);
  EXPECT_EQ(d.is_host(), c.type == DeviceType::CPU);
}

TEST_P(DeviceParseTest, CanonicalFormParsesToItself) {
  const Device d = Device::parse(GetParam().spec);
  const Device again = Device::parse(d.to_string());
  EXPECT_EQ(again, d);
  EXPECT_EQ(again.to_string(), d.to_string());
}

TEST_P(DeviceParseTest, StreamsCanonicalForm) {
  std::ostringstream os;
  os << Device::parse(GetParam().spec);
  EXPECT_EQ(os.str(), GetParam().canonical);
}

INSTANTIATE_TEST_SUITE_P(
    ContractSpellings, DeviceParseTest,
    ::testing::Values(
        ParseCase{"GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0", "localhost", 0, 0, DeviceType::GPU, 0,
                  "GPU:0"},
        ParseCase{"gpu:0", "/job:localhost/replica:0/task:0/device:GPU:0", "localhost", 0, 0, DeviceType::GPU, 0,
                  "GPU:0"},
        ParseCase{"/gpu:0", "/job:localhost/replica:0/task:0/device:GPU:0", "localhost", 0, 0, DeviceType::GPU, 0,
                  "GPU:0"},
        ParseCase{"/GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0", "localhost", 0, 0, DeviceType::GPU, 0,
                  "GPU:0"},
        ParseCase{"/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0", "localhost", 0, 0, DeviceType::GPU,
                  0, "GPU:0"},
        ParseCase{"/job:worker/task:1/cpu:0", "/job:worker/replica:0/task:1/device:CPU:0", "worker", 0, 1,
                  DeviceType::CPU, 0, "CPU:0"},
        ParseCase{"/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0",
                  "localhost", 0, 0, DeviceType::CPU, 0, "CPU:0"},
        // Further spellings of the same grammar.
        ParseCase{"CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0", "localhost", 0, 0, DeviceType::CPU, 0,
                  "CPU:0"},
        ParseCase{"cpu:3", "/job:localhost/replica:0/task:0/device:CPU:3", "localhost", 0, 0, DeviceType::CPU, 3,
                  "CPU:3"},
        ParseCase{"/CPU:1", "/job:localhost/replica:0/task:0/device:CPU:1", "localhost", 0, 0, DeviceType::CPU, 1,
                  "CPU:1"},
        ParseCase{"/device:CPU:2", "/job:localhost/replica:0/task:0/device:CPU:2", "localhost", 0, 0, DeviceType::CPU,
                  2, "CPU:2"},
        ParseCase{"GPU:7", "/job:localhost/replica:0/task:0/device:GPU:7", "localhost", 0, 0, DeviceType::GPU, 7,
                  "GPU:7"},
        ParseCase{"GPU:12", "/job:localhost/replica:0/task:0/device:GPU:12", "localhost", 0, 0, DeviceType::GPU, 12,
                  "GPU:12"},
        ParseCase{"/job:worker/replica:2/task:3/device:GPU:1", "/job:worker/replica:2/task:3/device:GPU:1", "worker", 2,
                  3, DeviceType::GPU, 1, "GPU:1"},
        ParseCase{"/job:ps/gpu:1", "/job:ps/replica:0/task:0/device:GPU:1", "ps", 0, 0, DeviceType::GPU, 1, "GPU:1"},
        ParseCase{"/task:2/device:CPU:0", "/job:localhost/replica:0/task:2/device:CPU:0", "localhost", 0, 2,
                  DeviceType::CPU, 0, "CPU:0"}));

// ---------------------------------------------------------------------------------------------
// Device::parse — rejected spellings
// ---------------------------------------------------------------------------------------------

class DeviceParseErrorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceParseErrorTest, ThrowsInvalidArgumentNamingTheSpec) {
  const std::string& spec = GetParam();
  try {
    const Device d = Device::parse(spec);
    ADD_FAILURE() << "parse('" << spec << "') returned " << d.to_string() << " instead of throwing";
  } catch (const InvalidArgumentError& e) {
    EXPECT_EQ(e.code(), ErrorCode::INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr("'" + spec + "'"));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "parse('" << spec << "') threw the wrong type: " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(BadSpellings, DeviceParseErrorTest,
                         ::testing::Values(
                             // Lower case after `device:`.
                             "/device:gpu:0", "/device:cpu:0",
                             // Unknown attributes / device types.
                             "/foo:1", "/foo:1/cpu:0", "/cpu:0/foo:1", "/device:XPU:0",
                             // Two device types.
                             "/cpu:0/gpu:0", "/gpu:0/gpu:1", "/device:CPU:0/device:GPU:0", "/device:GPU:0/cpu:0",
                             // Non-integer or negative indices.
                             "GPU:x", "GPU:-1", "GPU:1.5", "GPU: 1", "GPU:1a", "/device:GPU:x",
                             "/job:worker/task:x/cpu:0", "/job:worker/replica:-1/cpu:0",
                             // Empty, or a missing part.
                             "", "/", "GPU", "GPU:", "/device:GPU", "/device:GPU:", "/job:worker", "/job:worker/task:1",
                             "/job:/cpu:0",
                             // Extra separators.
                             "GPU:0:1", "/gpu:0/", "//gpu:0",
                             // Repeated attributes.
                             "/job:a/job:b/cpu:0", "/task:1/task:2/cpu:0"));

TEST(DeviceParse, ErrorMessageSaysWhatIsWrong) {
  EXPECT_THROW(Device::parse("/device:gpu:0"), InvalidArgumentError);
  try {
    Device::parse("/foo:1");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'/foo:1'"));
    EXPECT_THAT(e.what(), HasSubstr("foo"));
  }
  try {
    Device::parse("GPU:x");
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'GPU:x'"));
    EXPECT_THAT(e.what(), HasSubstr("'x'"));
  }
}

TEST(DeviceParse, ErrorsAreCatchableAsBaseError) {
  EXPECT_THROW(Device::parse("GPU:-1"), Error);
  EXPECT_THROW(Device::parse("GPU:-1"), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------
// Equality, construction, names
// ---------------------------------------------------------------------------------------------

TEST(Device, DefaultIsLocalCpu0) {
  const Device d;
  EXPECT_EQ(d.type(), DeviceType::CPU);
  EXPECT_EQ(d.index(), 0);
  EXPECT_EQ(d.job(), "localhost");
  EXPECT_EQ(d.replica(), 0);
  EXPECT_EQ(d.task(), 0);
  EXPECT_TRUE(d.is_host());
  EXPECT_EQ(d.to_string(), "/job:localhost/replica:0/task:0/device:CPU:0");
  EXPECT_EQ(d, cpu0);
}

TEST(Device, TypeIndexConstructor) {
  const Device g(DeviceType::GPU, 3);
  EXPECT_EQ(g.type(), DeviceType::GPU);
  EXPECT_EQ(g.index(), 3);
  EXPECT_FALSE(g.is_host());
  EXPECT_EQ(g.to_string(), "/job:localhost/replica:0/task:0/device:GPU:3");
  EXPECT_EQ(g.short_name(), "GPU:3");
  EXPECT_EQ(g, Device::parse("GPU:3"));
}

TEST(Device, EqualityAcrossSpellings) {
  const std::vector<std::string> gpu0 = {"GPU:0",  "gpu:0",         "/gpu:0",
                                         "/GPU:0", "/device:GPU:0", "/job:localhost/replica:0/task:0/device:GPU:0"};
  for (const auto& a : gpu0)
    for (const auto& b : gpu0) EXPECT_EQ(Device::parse(a), Device::parse(b)) << a << " vs " << b;
  EXPECT_EQ(Device::parse("CPU:0"), Device(DeviceType::CPU, 0));
  EXPECT_EQ(Device::parse("/job:localhost/replica:0/task:0/device:CPU:0"), cpu0);
}

TEST(Device, InequalityOnEveryField) {
  const Device base = Device::parse("/job:worker/replica:1/task:2/device:GPU:3");
  EXPECT_EQ(base, Device::parse("/job:worker/replica:1/task:2/device:GPU:3"));
  EXPECT_FALSE(base == Device::parse("/job:chief/replica:1/task:2/device:GPU:3"));   // job
  EXPECT_FALSE(base == Device::parse("/job:worker/replica:0/task:2/device:GPU:3"));  // replica
  EXPECT_FALSE(base == Device::parse("/job:worker/replica:1/task:0/device:GPU:3"));  // task
  EXPECT_FALSE(base == Device::parse("/job:worker/replica:1/task:2/device:CPU:3"));  // type
  EXPECT_FALSE(base == Device::parse("/job:worker/replica:1/task:2/device:GPU:0"));  // index
  EXPECT_FALSE(Device::parse("CPU:0") == Device::parse("CPU:1"));
  EXPECT_FALSE(Device::parse("CPU:0") == Device::parse("GPU:0"));
}

TEST(Device, ShortName) {
  EXPECT_EQ(Device::parse("/job:worker/task:1/cpu:0").short_name(), "CPU:0");
  EXPECT_EQ(Device::parse("/device:GPU:2").short_name(), "GPU:2");
  EXPECT_EQ(Device::parse("cpu:5").short_name(), "CPU:5");
}

TEST(Device, DeviceTypeName) {
  EXPECT_STREQ(device_type_name(DeviceType::CPU), "CPU");
  EXPECT_STREQ(device_type_name(DeviceType::GPU), "GPU");
}

// ---------------------------------------------------------------------------------------------
// Discovery and configuration
// ---------------------------------------------------------------------------------------------

TEST(ListLogicalDevices, CpuIsCpu0) {
  const std::vector<Device> cpus = list_logical_devices(DeviceType::CPU);
  ASSERT_EQ(cpus.size(), 1u);
  EXPECT_EQ(cpus[0], Device(DeviceType::CPU, 0));
  EXPECT_EQ(cpus[0].to_string(), "/job:localhost/replica:0/task:0/device:CPU:0");
}

TEST(ListLogicalDevices, GpuNeverThrows) {
  std::vector<Device> gpus;
  EXPECT_NO_THROW(gpus = list_logical_devices(DeviceType::GPU));
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(gpus[i].type(), DeviceType::GPU);
    EXPECT_EQ(gpus[i].index(), static_cast<int>(i));
  }
}

TEST(ListLogicalDevices, NoGpuOnThisMachine) {
  if (!list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "GPUs are visible";
  EXPECT_TRUE(list_logical_devices(DeviceType::GPU).empty());
  EXPECT_FALSE(device_exists(Device::parse("GPU:0")));
}

TEST(DeviceExists, AnyCpuExists) {
  EXPECT_TRUE(device_exists(Device::parse("CPU:0")));
  EXPECT_TRUE(device_exists(Device::parse("CPU:1")));
  EXPECT_TRUE(device_exists(Device::parse("CPU:63")));
}

TEST(DeviceExists, GpuBeyondVisibleCountDoesNot) {
  const int n = static_cast<int>(list_logical_devices(DeviceType::GPU).size());
  EXPECT_FALSE(device_exists(Device(DeviceType::GPU, n)));
  for (int i = 0; i < n; ++i) EXPECT_TRUE(device_exists(Device(DeviceType::GPU, i)));
}

TEST(SetLogicalGpuDevices, MissingPhysicalGpuIsNotFound) {
  if (!list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "GPUs are visible";
  try {
    config::set_logical_gpu_devices(0, 2);
    FAIL() << "no exception";
  } catch (const NotFoundError& e) {
    EXPECT_EQ(e.code(), ErrorCode::NOT_FOUND);
    EXPECT_THAT(e.what(), HasSubstr("0 GPUs are visible"));
  }
  EXPECT_TRUE(list_logical_devices(DeviceType::GPU).empty());
}

TEST(SetLogicalGpuDevices, NegativePhysicalGpuIsNotFound) {
  EXPECT_THROW(config::set_logical_gpu_devices(-1, 2), NotFoundError);
}

TEST(SetLogicalGpuDevices, GpuPastTheVisibleOnesIsNotFound) {
  // Logical count >= physical count, so this index is never a physical GPU.
  const int n = static_cast<int>(list_logical_devices(DeviceType::GPU).size());
  EXPECT_THROW(config::set_logical_gpu_devices(n, 2), NotFoundError);
}

TEST(SetLogicalGpuDevices, CountBelowOneIsInvalidArgument) {
  try {
    config::set_logical_gpu_devices(0, 0);
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("0"));
  }
  EXPECT_THROW(config::set_logical_gpu_devices(0, -3), InvalidArgumentError);
}

// Tensors on a GPU that does not exist cannot be created.
TEST(DeviceMemory, TensorOnMissingGpuIsNotFound) {
  const int n = static_cast<int>(list_logical_devices(DeviceType::GPU).size());
  const Device missing(DeviceType::GPU, n);
  try {
    (void)Tensor<float>::zeros({2}, missing);
    FAIL() << "no exception";
  } catch (const NotFoundError& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.to_string()));
  }
}

// ---------------------------------------------------------------------------------------------
// MirroredStrategy device resolution
// ---------------------------------------------------------------------------------------------

TEST(MirroredStrategyDevices, MissingGpuIsNotFoundNamingTheDevice) {
  if (!list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "GPUs are visible";
  try {
    MirroredStrategy s({"GPU:0"});
    FAIL() << "no exception";
  } catch (const NotFoundError& e) {
    EXPECT_THAT(e.what(), HasSubstr("GPU:0"));
    EXPECT_THAT(e.what(), HasSubstr("0 GPUs are visible"));
  }
}

TEST(MirroredStrategyDevices, GpuPastTheVisibleOnesIsNotFound) {
  const std::size_t n = list_logical_devices(DeviceType::GPU).size();
  const std::string spec = "GPU:" + std::to_string(n);
  try {
    MirroredStrategy s({spec});
    FAIL() << "no exception";
  } catch (const NotFoundError& e) {
    EXPECT_THAT(e.what(), HasSubstr(spec));
    EXPECT_THAT(e.what(), HasSubstr(std::to_string(n) + " GPUs are visible"));
  }
}

TEST(MirroredStrategyDevices, DuplicatesAfterCanonicalisationAreRejected) {
  try {
    MirroredStrategy s({"CPU:0", "/cpu:0"});
    FAIL() << "no exception";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("No duplicates allowed in `devices` argument"));
  }
  EXPECT_THROW(MirroredStrategy({"CPU:1", "/job:localhost/replica:0/task:0/device:CPU:1"}), InvalidArgumentError);
}

TEST(MirroredStrategyDevices, AnotherJobOrTaskIsRejected) {
  for (const char* spec : {"/job:ps/task:3/device:CPU:1", "/job:worker/task:0/cpu:0", "/job:localhost/task:1/cpu:0",
                           "/job:localhost/replica:1/task:0/device:CPU:0"}) {
    const std::string msg = mirrored::testing::error_of<InvalidArgumentError>([&] {
      MirroredStrategy s({"CPU:0", spec});
    });
    EXPECT_THAT(msg, ::testing::HasSubstr(std::string("device '") + spec + "'")) << spec;
    EXPECT_THAT(msg, ::testing::HasSubstr("MultiWorkerMirroredStrategy")) << spec;
  }
  MirroredStrategy local({"/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:1"});
  EXPECT_EQ(local.num_replicas_in_sync(), 2);
  EXPECT_THROW(MirroredStrategy({"CPU:0", "CPU:1", "cpu:0"}), InvalidArgumentError);
}

TEST(MirroredStrategyDevices, UnparsableDeviceIsInvalidArgument) {
  EXPECT_THROW(MirroredStrategy({"/device:cpu:0"}), InvalidArgumentError);
  EXPECT_THROW(MirroredStrategy({"CPU:0", "CPU:x"}), InvalidArgumentError);
}

TEST(MirroredStrategyDevices, DefaultOnThisMachineIsOneCpuReplica) {
  if (!list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "GPUs are visible";
  MirroredStrategy s;
  EXPECT_EQ(s.num_replicas_in_sync(), 1);
  ASSERT_EQ(s.extended().worker_devices().size(), 1u);
  EXPECT_EQ(s.extended().worker_devices()[0], Device(DeviceType::CPU, 0));
  EXPECT_EQ(s.extended().worker_devices()[0].to_string(), "/job:localhost/replica:0/task:0/device:CPU:0");
}

TEST(MirroredStrategyDevices, DefaultUsesEveryVisibleGpu) {
  const std::vector<Device> gpus = list_logical_devices(DeviceType::GPU);
  if (gpus.empty()) GTEST_SKIP() << "no GPU";
  MirroredStrategy s;
  EXPECT_EQ(s.extended().worker_devices(), gpus);
}

TEST(MirroredStrategyDevices, EmptyListIsTheDefault) {
  MirroredStrategy a;
  MirroredStrategy b(std::vector<std::string>{});
  EXPECT_EQ(a.extended().worker_devices(), b.extended().worker_devices());
}

TEST(MirroredStrategyDevices, WorkerDevicesAreCanonicalAndInOrder) {
  MirroredStrategy s({"CPU:0", "CPU:1", "CPU:2"});
  EXPECT_EQ(s.num_replicas_in_sync(), 3);
  const std::vector<Device>& devices = s.extended().worker_devices();
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[0].to_string(), "/job:localhost/replica:0/task:0/device:CPU:0");
  EXPECT_EQ(devices[1].to_string(), "/job:localhost/replica:0/task:0/device:CPU:1");
  EXPECT_EQ(devices[2].to_string(), "/job:localhost/replica:0/task:0/device:CPU:2");
}

TEST(MirroredStrategyDevices, OrderFollowsTheArgumentAndSpellingsAreCanonicalised) {
  MirroredStrategy s({"/cpu:2", "cpu:0", "/device:CPU:1"});
  const std::vector<Device>& devices = s.extended().worker_devices();
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[0], Device(DeviceType::CPU, 2));
  EXPECT_EQ(devices[1], Device(DeviceType::CPU, 0));
  EXPECT_EQ(devices[2], Device(DeviceType::CPU, 1));
}

}  // namespace
}  // namespace mirrored
