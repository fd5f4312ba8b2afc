// The host device backend: every CPU:k is the host, served by one backend that runs synchronously.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "device/host/host_allocator.hpp"
#include "device/host/host_backend.hpp"
#include "device/host/host_half.hpp"
#include "device/host/host_optimizer.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail {
namespace {

// Elements summed per block: the running sum stays in L1 while inputs stream through.
constexpr int64_t kSumBlockBytes = 8192;

template <class T>
void binary_loop(BinaryOp op, const T* a, bool a_scalar, const T* b, bool b_scalar, T* out, int64_t n) {
  const int64_t sa = a_scalar ? 0 : 1, sb = b_scalar ? 0 : 1;
  switch (op) {
    case BinaryOp::add:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] + b[i * sb]);
      break;
    case BinaryOp::sub:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] - b[i * sb]);
      break;
    case BinaryOp::mul:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i * sa] * b[i * sb]);
      break;
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

// Sums in replica order; float16 and bfloat16 accumulate in float and round once per element,
// after the division by `mean_divisor` when it is > 0 (the other types ignore it).
template <class T>
void sum_n_loop(const void* const* inputs, int num_inputs, void* out_v, int64_t count, int64_t mean_divisor = 0) {
  using Acc = compute_type_t<T>;
  T* out = static_cast<T*>(out_v);
  if constexpr (std::is_same_v<Acc, T>) {
    // Up to four inputs (the pairwise steps of the ring between workers; the replicas of a small
    // machine): one pass reading every input at once, no block buffer, the same order of sums.
    const T* a = static_cast<const T*>(inputs[0]);
    const T* b = num_inputs > 1 ? static_cast<const T*>(inputs[1]) : nullptr;
    const T* c = num_inputs > 2 ? static_cast<const T*>(inputs[2]) : nullptr;
    const T* d = num_inputs > 3 ? static_cast<const T*>(inputs[3]) : nullptr;
    switch (num_inputs) {
      case 2:
        for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(a[i] + b[i]);
        return;
      case 3:
        for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<T>(a[i] + b[i]) + c[i]);
        return;
      case 4:
        for (int64_t i = 0; i < count; ++i)
          out[i] = static_cast<T>(static_cast<T>(static_cast<T>(a[i] + b[i]) + c[i]) + d[i]);
        return;
      default: break;
    }
  }
  constexpr int64_t block = kSumBlockBytes / static_cast<int64_t>(sizeof(Acc));
  Acc acc[block];
  for (int64_t base = 0; base < count; base += block) {
    const int64_t len = std::min(block, count - base);
    const T* first = static_cast<const T*>(inputs[0]) + base;
    for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(first[i]);
    for (int k = 1; k < num_inputs; ++k) {
      const T* in = static_cast<const T*>(inputs[k]) + base;
      for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<Acc>(acc[i] + static_cast<Acc>(in[i]));
    }
    if constexpr (std::is_same_v<Acc, T>) {
      std::memcpy(out + base, acc, static_cast<std::size_t>(len) * sizeof(T));
    } else {
      if (mean_divisor > 0) {
        const float d = static_cast<float>(mean_divisor);
        for (int64_t i = 0; i < len; ++i) out[base + i] = static_cast<T>(acc[i] / d);
      } else {
        for (int64_t i = 0; i < len; ++i) out[base + i] = static_cast<T>(acc[i]);
      }
    }
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
      binary_loop(op, static_cast<const T*>(a), a_scalar, static_cast<const T*>(b), b_scalar, static_cast<T*>(out),
                  count);
    });
  }

  void sum_n(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count) override {
    if (dtype == DType::float16 && host_has_f16c()) {
      f16c_sum(reinterpret_cast<const float16* const*>(inputs), num_inputs, static_cast<float16*>(out), count, 0);
      return;
    }
    visit_dtype(dtype, [&](auto zero) { sum_n_loop<decltype(zero)>(inputs, num_inputs, out, count); });
  }

  void sum_n_mean(DType dtype, const void* const* inputs, int num_inputs, void* out, int64_t count,
                  int64_t mean_divisor) override {
    if (dtype == DType::float16 && mean_divisor > 0 && host_has_f16c()) {
      f16c_sum(reinterpret_cast<const float16* const*>(inputs), num_inputs, static_cast<float16*>(out), count,
               mean_divisor);
      return;
    }
    if (!dtype_is_half(dtype) || mean_divisor <= 0) {
      DeviceBackend::sum_n_mean(dtype, inputs, num_inputs, out, count, mean_divisor);
      return;
    }
    visit_dtype(dtype, [&](auto zero) {
      if constexpr (is_half_v<decltype(zero)>) sum_n_loop<decltype(zero)>(inputs, num_inputs, out, count, mean_divisor);
    });
  }

  void sum_axis(DType dtype, const void* in_v, int64_t outer, int64_t length, int64_t inner, void* out_v) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      using Acc = compute_type_t<T>;
      const T* in = static_cast<const T*>(in_v);
      T* out = static_cast<T*>(out_v);
      std::vector<Acc> acc;  // float sums for the half types, rounded once at the end
      for (int64_t o = 0; o < outer; ++o) {
        T* dst = out + o * inner;
        if constexpr (std::is_same_v<Acc, T>) {
          std::fill_n(dst, inner, T{0});
          for (int64_t l = 0; l < length; ++l) {
            const T* src = in + (o * length + l) * inner;
            for (int64_t i = 0; i < inner; ++i) dst[i] = static_cast<T>(dst[i] + src[i]);
          }
        } else {
          acc.assign(static_cast<std::size_t>(inner), Acc{0});
          for (int64_t l = 0; l < length; ++l) {
            const T* src = in + (o * length + l) * inner;
            for (int64_t i = 0; i < inner; ++i) acc[i] += static_cast<Acc>(src[i]);
          }
          for (int64_t i = 0; i < inner; ++i) dst[i] = static_cast<T>(acc[i]);
        }
      }
    });
  }

  void divide(DType dtype, void* inout, int64_t count, int64_t divisor) override {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      T* p = static_cast<T*>(inout);
      if constexpr (is_half_v<T>) {  // divide in float, round once
        const float d = static_cast<float>(divisor);
        for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<float>(p[i]) / d);
      } else if constexpr (std::is_floating_point_v<T>) {
        const T d = static_cast<T>(divisor);
        for (int64_t i = 0; i < count; ++i) p[i] = p[i] / d;
      } else {
        MIRRORED_ENFORCE(divisor != 0, InvalidArgumentError, "divide: integer division by zero");
        for (int64_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / divisor);
      }
    });
  }

  void cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t count) override {
    if (host_has_f16c()) {  // the same bits as the loop below, eight at a time
      if (src_dtype == DType::float32 && dst_dtype == DType::float16)
        return f16c_narrow(static_cast<const float*>(src), static_cast<float16*>(dst), count);
      if (src_dtype == DType::float16 && dst_dtype == DType::float32)
        return f16c_widen(static_cast<const float16*>(src), static_cast<float*>(dst), count);
    }
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

  // Each replica thread updates its own copies here: a mirrored variable has one copy per
  // replica, so N replicas already split the work N ways without any barrier.
  void apply_optimizer(DType dtype, const OptimizerUpdate& u, const UpdateSegment* segments, int num_segments,
                       const int64_t* step_in, int64_t* step_out) override {
    host_apply_optimizer(dtype, u, segments, num_segments, step_in, step_out);
  }

  void synchronize_until(const Deadline&) override {}
};

}  // namespace

DeviceBackend& host_backend() {
  // Leaked on purpose, like the GPU runtime: a simulated GPU's stream threads run the host's loops
  // and may still be doing so while static objects are destroyed at exit.
  static DeviceBackend* const backend = new HostBackend;
  return *backend;
}

}  // namespace mirrored::detail
