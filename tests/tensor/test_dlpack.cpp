// DLPack interop (<mirrored/dlpack.hpp>): both directions without a copy, the producer's deleter
// called exactly once, every dtype and device mapping, and every refusal. The DLPackGpu cases need
// a GPU (ctest runs them on simulated GPUs as tensor.dlpack_simulated_gpus) and skip without one.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "mirrored/dlpack.hpp"
#include "mirrored/mirrored.hpp"
#include "mirrored/tensor.hpp"
#include "tensor/tensor_test_util.hpp"

namespace mirrored {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace mirrored::testing;  // NOLINT: the tensor test helpers

// A DLPack producer of host memory: owns a buffer, counts the calls of its deleter (which, as
// DLPack's contract says, frees the DLManagedTensor itself; the count outlives it).
template <class T>
struct Producer {
  std::vector<T> buffer;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
  std::shared_ptr<int> deleted;

  static void deleter(DLManagedTensor* self) noexcept {
    auto* p = static_cast<Producer*>(self->manager_ctx);
    ++*p->deleted;
    delete p;
  }
};

template <class T>
constexpr DLDataType dl_dtype_of() {
  if constexpr (std::is_same_v<T, float>) return {kDLFloat, 32, 1};
  if constexpr (std::is_same_v<T, double>) return {kDLFloat, 64, 1};
  if constexpr (std::is_same_v<T, int32_t>) return {kDLInt, 32, 1};
  if constexpr (std::is_same_v<T, int64_t>) return {kDLInt, 64, 1};
  if constexpr (std::is_same_v<T, float16>) return {kDLFloat, 16, 1};
  if constexpr (std::is_same_v<T, bfloat16>) return {kDLBfloat, 16, 1};
  return {kDLUInt, 8, 1};
}

// A producer of `shape` (compact, null strides unless set) whose elements are 1, 2, 3, …, after
// `offset` leading elements of padding (reached through byte_offset).
template <class T>
Producer<T>* make_producer(std::vector<int64_t> shape, std::shared_ptr<int> deleted, int64_t offset = 0) {
  auto* p = new Producer<T>;
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  p->buffer.assign(static_cast<std::size_t>(offset + n), T{0});
  for (int64_t i = 0; i < n; ++i) p->buffer[static_cast<std::size_t>(offset + i)] = static_cast<T>(i + 1);
  p->shape = std::move(shape);
  p->deleted = std::move(deleted);
  DLTensor& dl = p->managed.dl_tensor;
  dl.data = p->buffer.data();
  dl.device = {kDLCPU, 0};
  dl.ndim = static_cast<int>(p->shape.size());
  dl.dtype = dl_dtype_of<T>();
  dl.shape = p->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = static_cast<uint64_t>(offset) * sizeof(T);
  p->managed.manager_ctx = p;
  p->managed.deleter = &Producer<T>::deleter;
  return p;
}

template <class T>
std::vector<T> iota_values(int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<T>(i + 1);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Every element type, both directions
// ---------------------------------------------------------------------------------------------

template <class T>
class DLPackTyped : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, int32_t, int64_t, uint8_t, float16, bfloat16>;
TYPED_TEST_SUITE(DLPackTyped, ElementTypes);

TYPED_TEST(DLPackTyped, ToDLPackDescribesTheTensorsOwnMemory) {
  using T = TypeParam;
  const Tensor<T> t = Tensor<T>::from_vector(iota_values<T>(6), {2, 3}, kCpu1);
  DLManagedTensor* m = to_dlpack(t);
  const DLTensor& dl = m->dl_tensor;
  EXPECT_EQ(dl.data, t.data());
  EXPECT_EQ(dl.device.device_type, kDLCPU);
  EXPECT_EQ(dl.device.device_id, 0);  // DLPack: host memory is device 0, whichever CPU:k
  const DLDataType want = dl_dtype_of<T>();
  EXPECT_EQ(dl.dtype.code, want.code);
  EXPECT_EQ(dl.dtype.bits, want.bits);
  EXPECT_EQ(dl.dtype.lanes, want.lanes);
  ASSERT_EQ(dl.ndim, 2);
  EXPECT_EQ(dl.shape[0], 2);
  EXPECT_EQ(dl.shape[1], 3);
  ASSERT_NE(dl.strides, nullptr);
  EXPECT_EQ(dl.strides[0], 3);
  EXPECT_EQ(dl.strides[1], 1);
  EXPECT_EQ(dl.byte_offset, 0u);
  const T* values = static_cast<const T*>(dl.data);
  EXPECT_EQ(std::vector<T>(values, values + 6), iota_values<T>(6));
  m->deleter(m);
}

TYPED_TEST(DLPackTyped, FromDLPackWrapsTheProducersMemory) {
  using T = TypeParam;
  auto deleted = std::make_shared<int>(0);
  Producer<T>* p = make_producer<T>({3, 2}, deleted);
  const T* buffer = p->buffer.data();
  {
    Tensor<T> t = Tensor<T>::from_dlpack(&p->managed);
    EXPECT_EQ(t.data(), buffer);
    EXPECT_EQ(t.shape(), (Shape{3, 2}));
    EXPECT_EQ(t.device(), cpu0);
    EXPECT_EQ(t.dtype(), dtype_of<T>());
    EXPECT_EQ(t.to_vector(), iota_values<T>(6));
    t.data()[0] = T{42};  // writes reach the producer's memory
    EXPECT_EQ(buffer[0], T{42});
    EXPECT_EQ(*deleted, 0);
  }
  EXPECT_EQ(*deleted, 1);
}

TYPED_TEST(DLPackTyped, RoundTripSharesMemoryAndReleasesOnce) {
  using T = TypeParam;
  Tensor<T> original = Tensor<T>::from_vector(iota_values<T>(4), {4});
  const T* data = original.data();
  DLManagedTensor* m = to_dlpack(original);
  // Count the export's deleter calls by wrapping it.
  static int calls;
  static void (*inner)(DLManagedTensor*);
  calls = 0;
  inner = m->deleter;
  m->deleter = [](DLManagedTensor* self) {
    ++calls;
    inner(self);
  };
  Tensor<T> back = Tensor<T>::from_dlpack(m);
  EXPECT_EQ(back.data(), data);
  original = Tensor<T>();  // the export keeps the memory alive on its own
  EXPECT_EQ(back.to_vector(), iota_values<T>(4));
  EXPECT_EQ(calls, 0);
  back = Tensor<T>();
  EXPECT_EQ(calls, 1);
}

// ---------------------------------------------------------------------------------------------
// to_dlpack
// ---------------------------------------------------------------------------------------------

TEST(DLPack, ToDLPackKeepsTheStorageAliveUntilTheDeleter) {
  DLManagedTensor* m = nullptr;
  {
    Tensor<int32_t> t = Tensor<int32_t>::from_vector({7, 8, 9}, {3});
    m = to_dlpack(t);
  }
  // The tensor is gone; the memory is the consumer's until it calls the deleter (ASan would see a
  // use after free otherwise).
  const int32_t* values = static_cast<const int32_t*>(m->dl_tensor.data);
  EXPECT_EQ(std::vector<int32_t>(values, values + 3), vec({7, 8, 9}));
  m->deleter(m);
}

TEST(DLPack, ConsumerWritesAreSeenByTheTensor) {
  Tensor<float> t = Tensor<float>::zeros({2, 2});
  DLManagedTensor* m = to_dlpack(t);
  static_cast<float*>(m->dl_tensor.data)[3] = 5.0f;
  EXPECT_EQ(t.to_vector(), vec({0.0f, 0.0f, 0.0f, 5.0f}));
  m->deleter(m);
}

TEST(DLPack, ToDLPackOfScalarsAndEmptyTensors) {
  const Tensor<double> s = Tensor<double>::scalar(2.5);
  DLManagedTensor* m = to_dlpack(s);
  EXPECT_EQ(m->dl_tensor.ndim, 0);
  EXPECT_EQ(*static_cast<const double*>(m->dl_tensor.data), 2.5);
  Tensor<double> back = Tensor<double>::from_dlpack(m);
  EXPECT_EQ(back.shape(), Shape{});
  EXPECT_EQ(back.item(), 2.5);

  const Tensor<int64_t> e = Tensor<int64_t>::zeros({2, 0, 3});
  DLManagedTensor* me = to_dlpack(e);
  ASSERT_EQ(me->dl_tensor.ndim, 3);
  EXPECT_EQ(me->dl_tensor.shape[1], 0);
  Tensor<int64_t> eback = Tensor<int64_t>::from_dlpack(me);
  EXPECT_EQ(eback.shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(eback.numel(), 0);
}

// ---------------------------------------------------------------------------------------------
// from_dlpack: ownership
// ---------------------------------------------------------------------------------------------

TEST(DLPack, DeleterRunsOnceWhenTheLastOfManyHandlesGoes) {
  auto deleted = std::make_shared<int>(0);
  Producer<float>* p = make_producer<float>({2, 3}, deleted);
  std::vector<Tensor<float>> handles;
  {
    Tensor<float> t = Tensor<float>::from_dlpack(&p->managed);
    handles.push_back(t);               // a copy
    handles.push_back(t.reshape({6}));  // a view with another shape
    Tensor<float> moved = std::move(t);
    handles.push_back(moved);
    const Tensor<float> sum = moved + 1.0f;  // a new storage of its own
    EXPECT_EQ(sum.to_vector(), vec({2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f}));
  }
  EXPECT_EQ(*deleted, 0);
  // The last handles go on other threads.
  std::thread a([h = std::move(handles[0])]() mutable { h = Tensor<float>(); });
  std::thread b([h = std::move(handles[1])]() mutable { h = Tensor<float>(); });
  a.join();
  b.join();
  EXPECT_EQ(*deleted, 0);
  EXPECT_EQ(handles[2].to_vector(), vec({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
  handles.clear();
  EXPECT_EQ(*deleted, 1);
}

TEST(DLPack, NullDeleterIsAccepted) {
  std::vector<int32_t> buffer{1, 2};
  int64_t shape[] = {2};
  DLManagedTensor m{};
  m.dl_tensor = DLTensor{buffer.data(), {kDLCPU, 0}, 1, {kDLInt, 32, 1}, shape, nullptr, 0};
  {
    Tensor<int32_t> t = Tensor<int32_t>::from_dlpack(&m);
    EXPECT_EQ(t.to_vector(), vec({1, 2}));
  }
  SUCCEED();  // nothing to call; nothing crashed
}

TEST(DLPack, WrappedTensorsTakePartInCollectives) {
  // Each replica's gradient lives in a producer's buffer; the all-reduce reads them in place.
  // (A counter each: the replica threads may drop their handles at the same time.)
  std::vector<std::shared_ptr<int>> deleted{std::make_shared<int>(0), std::make_shared<int>(0)};
  std::vector<Producer<float>*> producers{make_producer<float>({3}, deleted[0]), make_producer<float>({3}, deleted[1])};
  {
    MirroredStrategy strategy({"CPU:0", "CPU:1"});
    auto sums = strategy.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      Tensor<float> grad =
          Tensor<float>::from_dlpack(&producers[static_cast<std::size_t>(r)]->managed, Device(DeviceType::CPU, r));
      return get_replica_context()->all_reduce(ReduceOp::SUM, grad * float(r + 1));
    });
    for (const Tensor<float>& s : strategy.experimental_local_results(sums))
      EXPECT_EQ(s.to_vector(), vec({3.0f, 6.0f, 9.0f}));  // 1·[1,2,3] + 2·[1,2,3]
  }
  EXPECT_EQ(*deleted[0], 1);
  EXPECT_EQ(*deleted[1], 1);
}

// ---------------------------------------------------------------------------------------------
// from_dlpack: layouts and devices it takes
// ---------------------------------------------------------------------------------------------

TEST(DLPack, ByteOffsetIsAdded) {
  auto deleted = std::make_shared<int>(0);
  Producer<int64_t>* p = make_producer<int64_t>({2, 2}, deleted, /*offset=*/3);
  const int64_t* expected = p->buffer.data() + 3;
  Tensor<int64_t> t = Tensor<int64_t>::from_dlpack(&p->managed);
  EXPECT_EQ(t.data(), expected);
  EXPECT_EQ(t.to_vector(), vec<int64_t>({1, 2, 3, 4}));
}

TEST(DLPack, CompactExplicitStridesAreTaken) {
  auto deleted = std::make_shared<int>(0);
  Producer<float>* p = make_producer<float>({2, 1, 3}, deleted);
  // Compact; the size-1 dimension's stride is arbitrary (PyTorch may give any there).
  p->strides = {3, 99, 1};
  p->managed.dl_tensor.strides = p->strides.data();
  Tensor<float> t = Tensor<float>::from_dlpack(&p->managed);
  EXPECT_EQ(t.shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(t.to_vector(), vec({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
}

TEST(DLPack, HostDeviceTypesBecomeTheRequestedCpu) {
  for (DLDeviceType type : {kDLCPU, kDLCUDAHost}) {
    auto deleted = std::make_shared<int>(0);
    Producer<uint8_t>* p = make_producer<uint8_t>({2}, deleted);
    p->managed.dl_tensor.device = {type, 0};
    Tensor<uint8_t> t = Tensor<uint8_t>::from_dlpack(&p->managed, kCpu1);
    EXPECT_EQ(t.device(), kCpu1);
    EXPECT_EQ(t.to_vector(), vec<uint8_t>({1, 2}));
    t = Tensor<uint8_t>();
    EXPECT_EQ(*deleted, 1);
  }
}

// ---------------------------------------------------------------------------------------------
// from_dlpack: refusals (each leaves the DLManagedTensor to the caller: the deleter is not called)
// ---------------------------------------------------------------------------------------------

// Expects from_dlpack<T>(p) to throw InvalidArgumentError whose message has every one of `parts`,
// and the deleter not to have run; then releases the producer.
template <class T>
void expect_refused(Producer<T>* p, const std::shared_ptr<int>& deleted, const std::vector<std::string>& parts,
                    std::optional<Device> device = std::nullopt) {
  try {
    (void)Tensor<T>::from_dlpack(&p->managed, device);
    ADD_FAILURE() << "from_dlpack took it";
  } catch (const InvalidArgumentError& e) {
    for (const std::string& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
  EXPECT_EQ(*deleted, 0) << "a refusal must not call the deleter";
  p->managed.deleter(&p->managed);
  EXPECT_EQ(*deleted, 1);
}

TEST(DLPack, NullManagedTensorIsRefused) {
  EXPECT_THROW(
      {
        try {
          (void)Tensor<float>::from_dlpack(nullptr);
        } catch (const InvalidArgumentError& e) {
          EXPECT_THAT(e.what(), HasSubstr("Tensor<float32>::from_dlpack: the DLManagedTensor is null"));
          throw;
        }
      },
      InvalidArgumentError);
}

TEST(DLPack, EveryOtherDtypeIsRefused) {
  struct Case {
    DLDataType dtype;
    std::string described;
  };
  const std::vector<Case> cases = {
      {{kDLFloat, 64, 1}, "{code 2 (kDLFloat), bits 64, lanes 1} = float64"},
      {{kDLInt, 32, 1}, "{code 0 (kDLInt), bits 32, lanes 1} = int32"},
      {{kDLUInt, 32, 1}, "{code 1 (kDLUInt), bits 32, lanes 1}"},
      {{kDLFloat, 32, 4}, "{code 2 (kDLFloat), bits 32, lanes 4}"},  // a vector type
      {{kDLFloat, 16, 1}, "{code 2 (kDLFloat), bits 16, lanes 1} = float16"},
      {{kDLBfloat, 16, 1}, "{code 4 (kDLBfloat), bits 16, lanes 1} = bfloat16"},
      {{kDLFloat, 8, 1}, "{code 2 (kDLFloat), bits 8, lanes 1}"},
      {{kDLComplex, 64, 1}, "{code 5 (kDLComplex), bits 64, lanes 1}"},
      {{kDLOpaqueHandle, 32, 1}, "{code 3 (kDLOpaqueHandle), bits 32, lanes 1}"},
      {{200, 32, 1}, "{code 200, bits 32, lanes 1}"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.described);
    auto deleted = std::make_shared<int>(0);
    Producer<float>* p = make_producer<float>({2}, deleted);
    p->managed.dl_tensor.dtype = c.dtype;
    expect_refused(p, deleted,
                   {"Tensor<float32>::from_dlpack: the DLPack tensor's dtype " + c.described,
                    "is not the dtype of a Tensor<float32> {code 2 (kDLFloat), bits 32, lanes 1} = float32"});
  }
  // And each element type refuses the others' dtypes.
  auto deleted = std::make_shared<int>(0);
  Producer<uint8_t>* p = make_producer<uint8_t>({2}, deleted);
  p->managed.dl_tensor.dtype = {kDLInt, 8, 1};
  expect_refused(p, deleted, {"Tensor<uint8>::from_dlpack", "{code 0 (kDLInt), bits 8, lanes 1}", "= uint8"});
}

TEST(DLPack, UnsupportedDeviceTypesAreRefused) {
  struct Case {
    int type;
    std::string described;
  };
  const std::vector<Case> cases = {{kDLOpenCL, "kDLOpenCL:0"}, {kDLVulkan, "kDLVulkan:0"},
                                   {kDLMetal, "kDLMetal:0"},   {kDLVPI, "kDLVPI:0"},
                                   {kDLROCM, "kDLROCM:0"},     {kDLROCMHost, "kDLROCMHost:0"},
                                   {kDLExtDev, "kDLExtDev:0"}, {kDLCUDAManaged, "kDLCUDAManaged:0"},
                                   {99, "device type 99:0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.described);
    auto deleted = std::make_shared<int>(0);
    Producer<int32_t>* p = make_producer<int32_t>({2}, deleted);
    // (Stored as the int it is: 99 is no value of the enum, as a newer producer's type may not be.)
    std::memcpy(&p->managed.dl_tensor.device.device_type, &c.type, sizeof(int));
    p->managed.dl_tensor.device.device_id = 0;
    expect_refused(p, deleted,
                   {"Tensor<int32>::from_dlpack: the DLPack tensor is on " + c.described,
                    "a device type this library does not support (it takes kDLCPU, kDLCUDA, kDLCUDAHost)",
                    "for a tensor on a CPU or GPU"});
  }
}

TEST(DLPack, GpusThisProcessDoesNotHaveAreRefused) {
  for (int id : {-1, 1000}) {
    auto deleted = std::make_shared<int>(0);
    Producer<float>* p = make_producer<float>({2}, deleted);
    p->managed.dl_tensor.device = {kDLCUDA, id};
    expect_refused(p, deleted,
                   {"Tensor<float32>::from_dlpack: the DLPack tensor is on kDLCUDA:" + std::to_string(id),
                    "a GPU this process does not have (it has " +
                        std::to_string(list_logical_devices(DeviceType::GPU).size()) + " GPUs)"});
  }
}

TEST(DLPack, HostMemoryIsNotAGpuTensor) {
  auto deleted = std::make_shared<int>(0);
  Producer<float>* p = make_producer<float>({2}, deleted);
  expect_refused(p, deleted,
                 {"Tensor<float32>::from_dlpack: the DLPack tensor is in host memory (kDLCPU:0)",
                  "which cannot be a tensor on GPU:0"},
                 Device(DeviceType::GPU, 0));
}

TEST(DLPack, NonCompactStridesAreRefused) {
  auto deleted = std::make_shared<int>(0);
  Producer<double>* p = make_producer<double>({2, 3}, deleted);
  p->strides = {1, 2};  // the transpose of a 3×2 array
  p->managed.dl_tensor.strides = p->strides.data();
  expect_refused(p, deleted,
                 {"Tensor<float64>::from_dlpack: the DLPack tensor is not compact row-major: shape [2, 3] with "
                  "strides [1, 2], a Tensor needs strides [3, 1]"});

  deleted = std::make_shared<int>(0);
  p = make_producer<double>({4}, deleted);
  p->strides = {2};  // every other element
  p->managed.dl_tensor.strides = p->strides.data();
  expect_refused(p, deleted, {"not compact row-major: shape [4] with strides [2], a Tensor needs strides [1]"});
}

TEST(DLPack, BadShapesAreRefused) {
  auto deleted = std::make_shared<int>(0);
  Producer<float>* p = make_producer<float>({2}, deleted);
  p->managed.dl_tensor.ndim = -1;
  expect_refused(p, deleted, {"Tensor<float32>::from_dlpack: the DLPack tensor has ndim -1"});

  deleted = std::make_shared<int>(0);
  p = make_producer<float>({2}, deleted);
  p->managed.dl_tensor.shape = nullptr;
  expect_refused(p, deleted, {"Tensor<float32>::from_dlpack: the DLPack tensor has ndim 1 and a null shape"});

  deleted = std::make_shared<int>(0);
  p = make_producer<float>({2}, deleted);
  p->shape = {2, -3};
  p->managed.dl_tensor.ndim = 2;
  p->managed.dl_tensor.shape = p->shape.data();
  expect_refused(p, deleted, {"Tensor<float32>::from_dlpack: shape (2, -3) has a negative dimension"});

  deleted = std::make_shared<int>(0);
  p = make_producer<float>({2}, deleted);
  p->shape = {int64_t{1} << 40, int64_t{1} << 40};
  p->managed.dl_tensor.ndim = 2;
  p->managed.dl_tensor.shape = p->shape.data();
  expect_refused(p, deleted, {"Tensor<float32>::from_dlpack: shape", "is too large"});
}

TEST(DLPack, BadDataPointersAreRefused) {
  auto deleted = std::make_shared<int>(0);
  Producer<int32_t>* p = make_producer<int32_t>({3}, deleted);
  p->managed.dl_tensor.data = nullptr;
  expect_refused(p, deleted,
                 {"Tensor<int32>::from_dlpack: the DLPack tensor's data is null but its shape [3] has 3 elements"});

  deleted = std::make_shared<int>(0);
  p = make_producer<int32_t>({3}, deleted, /*offset=*/1);
  p->managed.dl_tensor.byte_offset = 2;  // half an element in
  expect_refused(p, deleted,
                 {"Tensor<int32>::from_dlpack: the DLPack tensor's data + byte_offset (2) is not aligned to the 4 "
                  "bytes of a int32"});
}

// ---------------------------------------------------------------------------------------------
// GPUs (skip without one; tensor.dlpack_simulated_gpus runs them on two simulated GPUs)
// ---------------------------------------------------------------------------------------------

class DLPackGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = list_logical_devices(DeviceType::GPU);
    if (gpus_.empty()) GTEST_SKIP() << "no GPU";
  }
  std::vector<Device> gpus_;
};

TEST_F(DLPackGpu, RoundTripOnAGpuSharesMemory) {
  const Device& gpu = gpus_.front();
  Tensor<float> t = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, gpu);
  DLManagedTensor* m = to_dlpack(t);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, detail::dlpack_cuda_ordinal(gpu));
  EXPECT_EQ(m->dl_tensor.data, t.data());
  Tensor<float> back = Tensor<float>::from_dlpack(m);
  EXPECT_EQ(back.device(), gpu);
  EXPECT_EQ(back.data(), t.data());
  t = Tensor<float>();
  EXPECT_EQ(back.to_vector(), vec({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}));
  // Kernels on the wrapped memory work as on the library's own.
  EXPECT_EQ((back * 2.0f).to_vector(), vec({2.0f, 4.0f, 6.0f, 8.0f, 10.0f, 12.0f}));
}

TEST_F(DLPackGpu, EachCudaOrdinalIsItsGpu) {
  for (const Device& gpu : gpus_) {
    SCOPED_TRACE(gpu.short_name());
    Tensor<int64_t> t = Tensor<int64_t>::full({2}, int64_t{gpu.index() + 1}, gpu);
    DLManagedTensor* m = to_dlpack(t);
    EXPECT_EQ(m->dl_tensor.device.device_id, detail::dlpack_cuda_ordinal(gpu));
    Tensor<int64_t> back = Tensor<int64_t>::from_dlpack(m, gpu);
    EXPECT_EQ(back.device(), gpu);
    EXPECT_EQ(back.to_vector(), vec<int64_t>({gpu.index() + 1, gpu.index() + 1}));
  }
}

TEST_F(DLPackGpu, GpuMemoryIsNotAHostTensorNorAnotherGpus) {
  Tensor<float> t = Tensor<float>::zeros({2}, gpus_.front());
  DLManagedTensor* m = to_dlpack(t);
  try {
    (void)Tensor<float>::from_dlpack(m, kCpu1);
    ADD_FAILURE() << "from_dlpack took it";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the DLPack tensor is on kDLCUDA:0, which cannot be a tensor on CPU:1"));
  }
  for (const Device& other : gpus_) {
    if (detail::dlpack_cuda_ordinal(other) == m->dl_tensor.device.device_id) continue;
    try {
      (void)Tensor<float>::from_dlpack(m, other);
      ADD_FAILURE() << "from_dlpack took it";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("which cannot be a tensor on " + other.short_name()));
    }
  }
  m->deleter(m);  // refused: still ours to release
}

TEST_F(DLPackGpu, AnOrdinalPastTheLastGpuIsRefused) {
  Tensor<float> t = Tensor<float>::zeros({2}, gpus_.front());
  DLManagedTensor* m = to_dlpack(t);
  const int past = static_cast<int>(gpus_.size());
  m->dl_tensor.device.device_id = past;
  try {
    (void)Tensor<float>::from_dlpack(m);
    ADD_FAILURE() << "from_dlpack took it";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("kDLCUDA:" + std::to_string(past)),
                                HasSubstr("a GPU this process does not have (it has " + std::to_string(past))));
  }
  m->deleter(m);
}

}  // namespace
}  // namespace mirrored
