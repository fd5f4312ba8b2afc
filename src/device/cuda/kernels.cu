// The CUDA backend's kernels: grid-stride loops over 64-bit indices, one template per element
// type. The arithmetic is written exactly like the host backend's (src/host_backend.cpp), in the
// same order, so that results match it bit for bit (nvcc's defaults: IEEE division, and there is
// no multiply-add to contract). float16 and bfloat16 are `__half` and `__nv_bfloat16` here: every
// kernel widens them to float, computes, and rounds once to nearest even (`__float2half_rn`,
// `__float2bfloat16_rn`), as the host backend does; sums accumulate in float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "device/cuda/kernels.hpp"
#include "mirrored/detail/optimizer_formulas.hpp"

namespace mirrored::detail::cuda_kernels {
namespace {

// The index arithmetic (grid_blocks, for_each_index, ...) is kernel_index.hpp's, tested on the host.

// This thread's walk of the grid-stride loop.
__device__ __forceinline__ GridStride this_thread() {
  return grid_stride(blockIdx.x, blockDim.x, threadIdx.x, gridDim.x);
}

// The type a kernel computes `T` in, and the conversions to and from it.
template <class T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<__half> {
  using type = float;
};
template <>
struct ComputeType<__nv_bfloat16> {
  using type = float;
};
template <class T>
using C = typename ComputeType<T>::type;

template <class T>
__device__ __forceinline__ C<T> up(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return x;
}

template <class T>
__device__ __forceinline__ T down(C<T> x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

template <class F>
cudaError_t with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::int32: return f(int32_t{});
    case DType::int64: return f(int64_t{});
    case DType::uint8: return f(uint8_t{});
    case DType::float16: return f(__half{});
    case DType::bfloat16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

// --- fill ---------------------------------------------------------------------------------------

template <class T>
__global__ void fill_kernel(T* dst, int64_t n, T value) {
  for_each_index(this_thread(), n, [&](int64_t i) { dst[i] = value; });
}

// --- binary -------------------------------------------------------------------------------------

template <class T, int Op>
__global__ void binary_kernel(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n) {
  for_each_index(this_thread(), n, [&](int64_t i) {
    const C<T> x = up(a[i * sa]), y = up(b[i * sb]);
    if constexpr (Op == 0)
      out[i] = down<T>(static_cast<C<T>>(x + y));
    else if constexpr (Op == 1)
      out[i] = down<T>(static_cast<C<T>>(x - y));
    else if constexpr (Op == 2)
      out[i] = down<T>(static_cast<C<T>>(x * y));
    else
      out[i] = down<T>(static_cast<C<T>>(x / y));  // floating point only
  });
}

template <class T>
__global__ void int_div_kernel(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n,
                               unsigned long long* zero_at) {
  for_each_index(this_thread(), n, [&](int64_t i) {
    const T x = a[i * sa], y = b[i * sb];
    if (y == T(0)) {
      atomicMin(zero_at, static_cast<unsigned long long>(i));
      out[i] = T(0);
      return;
    }
    if constexpr (std::is_signed_v<T>) {
      if (y == T(-1)) {  // MIN / -1 overflows; wrap like the host backend (and numpy)
        out[i] = static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x));
        return;
      }
    }
    out[i] = static_cast<T>(x / y);
  });
}

// --- sums ---------------------------------------------------------------------------------------

template <class T>
struct Pointers {
  const T* p[kMaxSumInputs];
};

template <class T>
__global__ void sum_n_kernel(Pointers<T> in, int k, const T* acc, T* out, int64_t n, int64_t mean_divisor) {
  for_each_index(this_thread(), n, [&](int64_t i) {
    int first = 0;
    C<T> s;
    if (acc) {
      s = up(acc[i]);
    } else {
      s = up(in.p[0][i]);
      first = 1;
    }
    for (int j = first; j < k; ++j) s = static_cast<C<T>>(s + up(in.p[j][i]));
    // MEAN divides before the one rounding (float for the half types), as the fused kernel and
    // the host backend do.
    if (mean_divisor > 0) {
      if constexpr (std::is_floating_point_v<C<T>>)
        s = s / static_cast<C<T>>(mean_divisor);
      else
        s = static_cast<T>(s / mean_divisor);
    }
    out[i] = down<T>(s);
  });
}

template <class T>
__global__ void sum_axis_kernel(const T* in, int64_t outer, int64_t length, int64_t inner, T* out) {
  const int64_t total = outer * inner;
  for_each_index(this_thread(), total, [&](int64_t idx) {
    C<T> s = C<T>(0);
    const T* src = in + sum_axis_source(idx, length, inner);
    for (int64_t l = 0; l < length; ++l) s = static_cast<C<T>>(s + up(src[l * inner]));
    out[idx] = down<T>(s);
  });
}

template <class T>
__global__ void divide_kernel(T* p, int64_t n, int64_t divisor) {
  for_each_index(this_thread(), n, [&](int64_t i) {
    if constexpr (std::is_floating_point_v<C<T>>)
      p[i] = down<T>(up(p[i]) / static_cast<C<T>>(divisor));
    else
      p[i] = static_cast<T>(p[i] / divisor);
  });
}

template <class S, class D>
__global__ void cast_kernel(const S* in, D* out, int64_t n) {
  for_each_index(this_thread(), n, [&](int64_t i) { out[i] = down<D>(static_cast<C<D>>(up(in[i]))); });
}

template <class T>
struct FusedPointers {
  const T* in[kMaxFusedReplicas];
  T* out[kMaxFusedReplicas];
};

// 16 bytes of T, loaded and stored as one vector (the same sums, element by element).
template <class T>
struct alignas(16) Vec16 {
  static constexpr int kLanes = 16 / static_cast<int>(sizeof(T));
  T v[kLanes];
};

template <class T>
__global__ void all_reduce_fused_vec_kernel(FusedPointers<T> p, int k, int64_t nvec, int64_t mean_divisor) {
  using V = Vec16<T>;
  for_each_index(this_thread(), nvec, [&](int64_t i) {
    const V first = reinterpret_cast<const V*>(p.in[0])[i];
    C<T> acc[V::kLanes];
#pragma unroll
    for (int e = 0; e < V::kLanes; ++e) acc[e] = up(first.v[e]);
    for (int j = 1; j < k; ++j) {
      const V x = reinterpret_cast<const V*>(p.in[j])[i];
#pragma unroll
      for (int e = 0; e < V::kLanes; ++e) acc[e] = static_cast<C<T>>(acc[e] + up(x.v[e]));
    }
    if (mean_divisor > 0) {
#pragma unroll
      for (int e = 0; e < V::kLanes; ++e) {
        if constexpr (std::is_floating_point_v<C<T>>)
          acc[e] = acc[e] / static_cast<C<T>>(mean_divisor);
        else
          acc[e] = static_cast<T>(acc[e] / mean_divisor);
      }
    }
    V s;
#pragma unroll
    for (int e = 0; e < V::kLanes; ++e) s.v[e] = down<T>(acc[e]);
    for (int j = 0; j < k; ++j) reinterpret_cast<V*>(p.out[j])[i] = s;
  });
}

template <class T>
__global__ void all_reduce_fused_kernel(FusedPointers<T> p, int k, int64_t n, int64_t mean_divisor) {
  for_each_index(this_thread(), n, [&](int64_t i) {
    C<T> acc = up(p.in[0][i]);
    for (int j = 1; j < k; ++j) acc = static_cast<C<T>>(acc + up(p.in[j][i]));
    if (mean_divisor > 0) {
      if constexpr (std::is_floating_point_v<C<T>>)
        acc = acc / static_cast<C<T>>(mean_divisor);
      else
        acc = static_cast<T>(acc / mean_divisor);
    }
    const T s = down<T>(acc);
    for (int j = 0; j < k; ++j) p.out[j][i] = s;
  });
}

// One element of the fused optimizer update: formula F (mirrored/detail/optimizer_formulas.hpp,
// the host's too) on the parameter and the kind's slots, loaded into registers and stored back.
// nvcc contracts the multiply-adds, so results may differ from the host's in the last bits.
template <class F, class T, std::size_t... K>
__device__ __forceinline__ void update_element(const typename F::template Scalars<T>& sc, const OptimizerSegments& s,
                                               int lo, int64_t e, std::index_sequence<K...>) {
  T* const param = static_cast<T*>(s.param[lo]) + e;
  T* const slot_at[F::slots + 1] = {static_cast<T*>(s.slot[K][lo]) + e..., nullptr};
  T w = *param;
  T slot[F::slots + 1] = {*slot_at[K]..., T{}};
  F::update(sc, w, static_cast<const T*>(s.grad[lo])[e], slot[K]...);
  *param = w;
  ((*slot_at[K] = slot[K]), ...);
}

template <class F, class T>
__global__ void apply_optimizer_kernel(OptimizerUpdate u, OptimizerSegments s, const int64_t* step_in,
                                       int64_t* step_out) {
  const int64_t step = *step_in + 1;
  if (step_out && blockIdx.x == 0 && threadIdx.x == 0) *step_out = step;
  const auto sc = F::template scalars<T>(u, step);
  const int64_t total = s.offset[s.count];
  for_each_index(this_thread(), total, [&](int64_t i) {
    const int lo = segment_of(s.offset, s.count, i);  // offset[lo] <= i < offset[lo + 1]
    update_element<F, T>(sc, s, lo, i - s.offset[lo], std::make_index_sequence<static_cast<std::size_t>(F::slots)>{});
  });
}

}  // namespace

cudaError_t fill(DType dtype, void* dst, int64_t n, const void* value, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T v;
    std::memcpy(&v, value, sizeof(T));
    fill_kernel<T><<<grid_blocks(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, v);
    return cudaGetLastError();
  });
}

cudaError_t binary(Binary op, DType dtype, const void* a, bool a_scalar, const void* b, bool b_scalar, void* out,
                   int64_t n, unsigned long long* div_by_zero_index, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(a);
    const T* y = static_cast<const T*>(b);
    T* o = static_cast<T*>(out);
    const int64_t sa = a_scalar ? 0 : 1, sb = b_scalar ? 0 : 1;
    const unsigned g = grid_blocks(n);
    switch (op) {
      case Binary::add: binary_kernel<T, 0><<<g, kThreads, 0, stream>>>(x, sa, y, sb, o, n); break;
      case Binary::sub: binary_kernel<T, 1><<<g, kThreads, 0, stream>>>(x, sa, y, sb, o, n); break;
      case Binary::mul: binary_kernel<T, 2><<<g, kThreads, 0, stream>>>(x, sa, y, sb, o, n); break;
      case Binary::div:
        if constexpr (std::is_integral_v<T>)
          int_div_kernel<T><<<g, kThreads, 0, stream>>>(x, sa, y, sb, o, n, div_by_zero_index);
        else
          binary_kernel<T, 3><<<g, kThreads, 0, stream>>>(x, sa, y, sb, o, n);
        break;
    }
    return cudaGetLastError();
  });
}

cudaError_t sum_n(DType dtype, const void* const* in, int k, const void* acc, void* out, int64_t n, cudaStream_t stream,
                  int64_t mean_divisor) {
  if (k < 0 || k > kMaxSumInputs || (k == 0 && !acc)) return cudaErrorInvalidValue;
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    Pointers<T> p{};
    for (int j = 0; j < k; ++j) p.p[j] = static_cast<const T*>(in[j]);
    sum_n_kernel<T><<<grid_blocks(n), kThreads, 0, stream>>>(p, k, static_cast<const T*>(acc), static_cast<T*>(out), n,
                                                             mean_divisor);
    return cudaGetLastError();
  });
}

cudaError_t sum_axis(DType dtype, const void* in, int64_t outer, int64_t length, int64_t inner, void* out,
                     cudaStream_t stream) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    sum_axis_kernel<T><<<grid_blocks(outer * inner), kThreads, 0, stream>>>(static_cast<const T*>(in), outer, length,
                                                                            inner, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t divide(DType dtype, void* inout, int64_t n, int64_t divisor, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    divide_kernel<T><<<grid_blocks(n), kThreads, 0, stream>>>(static_cast<T*>(inout), n, divisor);
    return cudaGetLastError();
  });
}

cudaError_t cast(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, cudaStream_t stream) {
  return with_dtype(src_dtype, [&](auto s) {
    using S = decltype(s);
    return with_dtype(dst_dtype, [&](auto d) {
      using D = decltype(d);
      cast_kernel<S, D><<<grid_blocks(n), kThreads, 0, stream>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      return cudaGetLastError();
    });
  });
}

cudaError_t all_reduce_fused(DType dtype, const void* const* in, void* const* out, int k, int64_t n,
                             int64_t mean_divisor, cudaStream_t stream) {
  if (k < 1 || k > kMaxFusedReplicas) return cudaErrorInvalidValue;
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    FusedPointers<T> p{};
    bool aligned = true;
    for (int j = 0; j < k; ++j) {
      p.in[j] = static_cast<const T*>(in[j]);
      p.out[j] = static_cast<T*>(out[j]);
      aligned =
          aligned && reinterpret_cast<uintptr_t>(in[j]) % 16 == 0 && reinterpret_cast<uintptr_t>(out[j]) % 16 == 0;
    }
    int64_t done = 0;
    if (aligned) {  // tensors start at allocator blocks: always, in practice
      const VectorSplit split = vector_split(n, Vec16<T>::kLanes);
      if (split.vectors > 0) {
        all_reduce_fused_vec_kernel<T>
            <<<grid_blocks(split.vectors), kThreads, 0, stream>>>(p, k, split.vectors, mean_divisor);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
      }
      done = split.tail_begin;
    }
    if (done == n) return cudaSuccess;
    for (int j = 0; j < k; ++j) {
      p.in[j] += done;
      p.out[j] += done;
    }
    all_reduce_fused_kernel<T><<<grid_blocks(n - done), kThreads, 0, stream>>>(p, k, n - done, mean_divisor);
    return cudaGetLastError();
  });
}

cudaError_t apply_optimizer(DType dtype, const OptimizerUpdate& u, const OptimizerSegments& segments,
                            const int64_t* step_in, int64_t* step_out, cudaStream_t stream) {
  if (segments.count < 0 || segments.count > kMaxOptimizerSegments) return cudaErrorInvalidValue;
  if (dtype != DType::float32 && dtype != DType::float64) return cudaErrorInvalidValue;
  const unsigned g = grid_blocks(segments.offset[segments.count]);
  // The kind picks the kernel by its formula's type: no kind is compared by number.
  const bool known = visit_optimizer_formula(u.kind, [&](auto formula) {
    using F = decltype(formula);
    if (dtype == DType::float32)
      apply_optimizer_kernel<F, float><<<g, kThreads, 0, stream>>>(u, segments, step_in, step_out);
    else
      apply_optimizer_kernel<F, double><<<g, kThreads, 0, stream>>>(u, segments, step_in, step_out);
  });
  if (!known) return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace mirrored::detail::cuda_kernels
