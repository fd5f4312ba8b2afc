// The first layer's direct convolution with its pool (cnn.hpp: single_channel_conv_pool_forward
// and _backward), compiled with the model's options (CMakeLists.txt).
#include <algorithm>

#include <mirrored/errors.hpp>

#include "fashion/cnn.hpp"

namespace fashion {
namespace {

// The single-channel convolution works on a register's worth of filters at a time (8 floats or 4
// doubles), the accumulators of a block in registers; the filters must be a multiple of 8.
constexpr int64_t kLanes = 8;

void check_single_channel(const Conv2DShape& s) {
  MIRRORED_ENFORCE(s.channels == 1 && s.filters >= kLanes && s.filters % kLanes == 0 && s.kernel == 3,
                   mirrored::InvalidArgumentError, "single-channel convolution: ", s.channels, " channels, ", s.filters,
                   " filters and a ", s.kernel, "x", s.kernel, " kernel; expected 1 channel, a multiple of ", kLanes,
                   " filters and 3x3");
}

constexpr int kTaps = 9;

// 32 bytes of T as one vector (the compiler's vector extension: one AVX register, or an SSE pair
// without AVX), and the same vector at T's alignment, through which T arrays are read and written
// (a vector type may alias its element type; no function passes a vector by value, whose calling
// convention would differ between AVX and SSE builds).
template <class T>
struct LaneVector;
template <>
struct LaneVector<float> {
  typedef float type __attribute__((vector_size(32)));
  typedef float unaligned __attribute__((vector_size(32), aligned(alignof(float))));
};
template <>
struct LaneVector<double> {
  typedef double type __attribute__((vector_size(32)));
  typedef double unaligned __attribute__((vector_size(32), aligned(alignof(double))));
};
template <class T>
using Lanes = typename LaneVector<T>::type;
template <class T>
constexpr int64_t kLanesOf = 32 / sizeof(T);  // divides kLanes
template <class T>
const typename LaneVector<T>::unaligned* lanes(const T* p) {
  return reinterpret_cast<const typename LaneVector<T>::unaligned*>(p);
}
template <class T>
typename LaneVector<T>::unaligned* lanes(T* p) {
  return reinterpret_cast<typename LaneVector<T>::unaligned*>(p);
}

// The 3x3 patches of a pooling window's four outputs (row-major), tap by tap.
template <class T>
void window_patches(const Conv2DShape& s, const T* x, int64_t b, int64_t i, int64_t j, T (&patch)[4][kTaps]) {
  for (int q = 0; q < 4; ++q) {
    const T* corner = x + (b * s.height + 2 * i + q / 2) * s.width + 2 * j + q % 2;
    for (int t = 0; t < kTaps; ++t) patch[q][t] = corner[(t / 3) * s.width + t % 3];
  }
}

}  // namespace

template <class T>
void single_channel_conv_pool_forward(const Conv2DShape& s, const T* x, const T* kernel, const T* bias, T* y,
                                      T* position) {
  check_single_channel(s);
  using V = Lanes<T>;
  const Pool2DShape p{s.batch, s.out_height(), s.out_width(), s.filters};
  const int64_t nf = s.filters;
  T patch[4][kTaps];
  int64_t o = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < p.out_height(); ++i)
      for (int64_t j = 0; j < p.out_width(); ++j, o += nf) {
        window_patches(s, x, b, i, j, patch);
        for (int64_t fb = 0; fb < nf; fb += kLanesOf<T>) {
          V acc[4] = {};
          for (int t = 0; t < kTaps; ++t) {
            const V w = *lanes(kernel + t * nf + fb);
            for (int q = 0; q < 4; ++q) acc[q] += patch[q][t] * w;
          }
          // The first maximum of a + bias, by vector selects (the comparisons are random).
          const V bl = *lanes(bias + fb);
          V max = acc[0] + bl, at = {};
          for (int q = 1; q < 4; ++q) {
            const V v = acc[q] + bl;
            at = v > max ? V{} + T(q) : at;
            max = v > max ? v : max;
          }
          *lanes(y + o + fb) = max > T(0) ? max : V{};
          *lanes(position + o + fb) = at;
        }
      }
}

template <class T>
void single_channel_conv_pool_backward(const Conv2DShape& s, const T* x, const T* dy, const T* y, const T* position,
                                       T* dkernel, T* dbias) {
  check_single_channel(s);
  using V = Lanes<T>;
  const Pool2DShape p{s.batch, s.out_height(), s.out_width(), s.filters};
  const int64_t nf = s.filters, windows = p.out_height() * p.out_width();
  std::fill_n(dkernel, kTaps * nf, T(0));
  std::fill_n(dbias, nf, T(0));
  T patch[4][kTaps];
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t fb = 0; fb < nf; fb += kLanesOf<T>) {
      // One image's sums for this block of filters (in registers), then added to the totals:
      // shorter float sums than one over the whole batch.
      V dk[kTaps] = {}, db = {};
      for (int64_t w = 0; w < windows; ++w) {
        const int64_t o = (b * windows + w) * nf + fb;
        window_patches(s, x, b, w / p.out_width(), w % p.out_width(), patch);
        const V g = *lanes(y + o) > T(0) ? V(*lanes(dy + o)) : V{};
        const V at = *lanes(position + o);
        for (int q = 0; q < 4; ++q) {
          const V share = at == T(q) ? g : V{};  // the filters whose maximum this position is
          db += share;
          for (int t = 0; t < kTaps; ++t) dk[t] += patch[q][t] * share;
        }
      }
      for (int t = 0; t < kTaps; ++t) *lanes(dkernel + t * nf + fb) += dk[t];
      *lanes(dbias + fb) += db;
    }
}

#define FASHION_INSTANTIATE(T)                                                                                       \
  template void single_channel_conv_pool_forward<T>(const Conv2DShape&, const T*, const T*, const T*, T*, T*);       \
  template void single_channel_conv_pool_backward<T>(const Conv2DShape&, const T*, const T*, const T*, const T*, T*, \
                                                     T*);

FASHION_INSTANTIATE(float)
FASHION_INSTANTIATE(double)
#undef FASHION_INSTANTIATE

}  // namespace fashion
