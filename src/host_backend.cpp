// The host device backend (every CPU:k) and the device-independent pieces of tensor storage.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "gpu_hooks.hpp"
#include "gpu_registry.hpp"
#include "host_allocator.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::detail {
namespace {

// Elements summed per block: the running sum stays in L1 while inputs stream through.
constexpr int64_t kSumBlockBytes = 8192;

template <class T>
void binary_loop(BinaryOp op, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n) {
  const int64_t sa = a_scalar ? 0 : 1, sb = b_scalar ? 0 : 1;
  switch (op) {
    case BinaryOp::add: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] + b[i * sb]); break;
    case BinaryOp::sub: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] - b[i * sb]); break;
    case BinaryOp::mul: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] * b[i * sb]); break;
    case BinaryOp::div:
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_integral_v<T>) {
          MIRRORED_ENFORCE(b[i * sb] != 0, InvalidArgumentError, "div: integer division by zero at element ", i);
          if constexpr (std::is_signed_v<T>) {
            // MIN / -1 overflows (SIGFPE on x86); wrap like numpy does.
            if (b[i * sb] == T(-1)) {
              out[i] = static_cast<T>(-static_cast<std::make_unsigned_t<T>>(a[i * sa]));
              continue;
            }
          }
        }
        out[i] = static_cast<T>(a[i * sa] / b[i * sb]);
      }
      break;
  }
}

template <class T>
void sum_n_loop(const void* const* inputs, int num_inputs, void* out_v, int64_t count) {
  constexpr int64_t block = kSumBlockBytes / static_cast<int64_t>(sizeof(T));
  T acc[block];
  T* out = static_cast<T*>(out_v);
  for (int64_t base = 0; base < count; base += block) {
    const int64_t len = std::min(block, count - base);
    const T* first = static_cast<const T*>(inputs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = first[i];
    for (int k = 1; k < num_inputs; ++k) {
      const T* in = static_cast<const T*>(inputs[k]) + base;
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
    }
    std::memcpy(out + base, acc, static_cast<std::size_t>(len) * sizeof(T));
  }
}

class HostBackend final : public DeviceBackend {
 public:
  const Device& device() const noexcept override { return cpu0; }

  void* allocate(std::size_t bytes) override { return host_allocate(bytes); }
  void deallocate(void* ptr, std::size_t bytes) noexcept override { host_deallocate(ptr, bytes); }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) override { std::memmove(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { std::memmove(dst, src, bytes); }
  void copy_within(void* dst, const void* src, std::size_t bytes) override { std::memmove(dst, src, bytes); }

  void fill(DType dtype, void* dst, int64_t count, const void* value) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      T v;
      std::memcpy(&v, value, sizeof(T));
      std::fill_n(static_cast<T*>(dst), count, v);
    });
  }

  void binary(BinaryOp op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
              int64_t count) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      binary_loop(op, static_cast<const T*>(a), a_scalar, static_cast<const T*>(b), b_scalar, static_cast<T*>(out), count);
    });
  }

  void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) override {
    visit_dtype(dtype, [&](auto zero) { sum_n_loop<decltype(zero)>(inputs, num_inputs, out, count); });
  }

  void sum_axis(DType dtype, const void* in_v, int64_t outer, int64_t length, int64_t inner, void* out_v) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      const T* in = static_cast<const T*>(in_v);
      T* out = static_cast<T*>(out_v);
      for (int64_t o = 0; o < outer; ++o) {
        T* dst = out + o * inner;
        std::fill_n(dst, inner, T{0});
        for (int64_t l = 0; l < length; ++l) {
          const T* src = in + (o * length + l) * inner;
          for (int64_t i = 0; i < inner; ++i) dst[i] = static_cast<T>(dst[i] + src[i]);
        }
      }
    });
  }

  void divide(DType dtype, void* inout, int64_t count, int64_t divisor) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      T* p = static_cast<T*>(inout);
      if constexpr (std::is_floating_point_v<T>) {
        const T d = static_cast<T>(divisor);
        for (int64_t i = 0; i < count; ++i) p[i] = p[i] / d;
      } else {
        MIRRORED_ENFORCE(divisor != 0, InvalidArgumentError, "divide: integer division by zero");
        for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / divisor);
      }
    });
  }

  void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) override {
    visit_dtype(src_dtype, [&](auto s) {
      using S = decltype(s);
      visit_dtype(dst_dtype, [&](auto d) {
        using D = decltype(d);
        const S* in = static_cast<const S*>(src);
        D* out = static_cast<D*>(dst);
        for (int64_t i = 0; i < count; ++i) out[i] = static_cast<D>(in[i]);
      });
    });
  }

  void synchronize() override {}
};

HostBackend& host_backend() {
  static HostBackend backend;
  return backend;
}

struct GpuFactory {
  std::mutex mu;
  std::function<DeviceBackend&(const Device&)> make;
};
GpuFactory& gpu_factory() {
  static GpuFactory f;
  return f;
}

}  // namespace

DeviceBackend& backend_for(const Device& device) {
  if (device.is_host()) return host_backend();
  const int visible = logical_gpu_count();
  MIRRORED_ENFORCE(device.index() < visible, NotFoundError, "Device ", device.to_string(), " not found: ", visible,
                   " GPUs are visible (", gpu_unavailable_reason(), ")");
  auto& f = gpu_factory();
  std::lock_guard lock(f.mu);
  MIRRORED_ENFORCE(static_cast<bool>(f.make), UnimplementedError, "Device ", device.to_string(),
                   ": this build has no GPU device backend, so tensors cannot be placed on GPUs");
  mark_gpus_used();
  return f.make(device);
}

void register_gpu_backend_factory(std::function<DeviceBackend&(const Device&)> factory) {
  auto& f = gpu_factory();
  std::lock_guard lock(f.mu);
  f.make = std::move(factory);
}

void copy_between(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_host() && src_device.is_host()) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (dst_device == src_device) {
    auto& be = backend_for(dst_device);
    be.copy_within(dst, src, bytes);
    be.synchronize();
    return;
  }
  if (dst_device.is_host()) {
    auto& be = backend_for(src_device);
    be.synchronize();
    be.copy_to_host(dst, src, bytes);
    return;
  }
  if (src_device.is_host()) {
    auto& be = backend_for(dst_device);
    be.copy_from_host(dst, src, bytes);
    be.synchronize();
    return;
  }
  // GPU to another GPU: a same-chip or peer copy when the CUDA part is there.
  if (copy_gpu_to_gpu(dst, dst_device, src, src_device, bytes)) return;
  // Device to another device: stage through host memory.
  std::vector<unsigned char> staging(bytes);
  auto& from = backend_for(src_device);
  from.synchronize();
  from.copy_to_host(staging.data(), src, bytes);
  auto& to = backend_for(dst_device);
  to.copy_from_host(dst, staging.data(), bytes);
  to.synchronize();
}

void prefetch_between(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                      std::size_t bytes) {
  if (bytes == 0) return;
  if (src_device.is_host() && !dst_device.is_host()) {
    backend_for(dst_device).prefetch_from_host(dst, src, bytes);
    return;
  }
  copy_between(dst, dst_device, src, src_device, bytes);
}

Storage::Storage(const Device& device, std::size_t bytes)
    : device_(device), backend_(&backend_for(device)), bytes_(bytes) {
  ptr_ = backend_->allocate(bytes);
}

Storage::~Storage() { backend_->deallocate(ptr_, bytes_); }

void check_same_device(const char* op, const Device& a, const Device& b) {
  MIRRORED_ENFORCE(a == b, InvalidArgumentError, op, ": operands are on different devices: ", a.to_string(), " vs ",
                   b.to_string());
}

void throw_incompatible_shapes(const char* op, const Shape& a, const Shape& b) {
  throw InvalidArgumentError(std::string(op) + ": Incompatible shapes: " + format_shape(a) + " vs. " + format_shape(b));
}

UntypedTensor make_untyped(DType dtype, const Shape& shape, const Device& device) {
  UntypedTensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.numel = shape_numel(shape);
  t.storage = std::make_shared<Storage>(device, std::max<std::size_t>(t.bytes(), 1));
  return t;
}

UntypedTensor cast_untyped(const UntypedTensor& t, DType dtype) {
  if (t.dtype == dtype) return t;
  UntypedTensor out = make_untyped(dtype, t.shape, t.device());
  if (t.numel) backend_for(t.device()).cast(t.dtype, t.data(), dtype, out.data(), t.numel);
  return out;
}

}  // namespace mirrored::detail
