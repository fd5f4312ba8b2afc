// The Fashion-MNIST model's layers and passes (cnn.hpp), compiled once, for float and double.
#include "fashion/cnn.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cstring>

#include <mirrored/eigen.hpp>
#include <mirrored/errors.hpp>
#include <mirrored/nn.hpp>

#include "common/glorot.hpp"
#include "fashion/fashion_data.hpp"

namespace fashion {
namespace {

template <class T>
using Matrix = mirrored::RowMatrix<T>;
template <class T>
using MatrixMap = Eigen::Map<Matrix<T>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const Matrix<T>>;
template <class T>
using RowVectorMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T>
using ConstRowVectorMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

constexpr int64_t kKernel = 3;
constexpr int64_t kConv1Filters = 32;
constexpr int64_t kConv2Filters = 64;
constexpr int64_t kDenseUnits = 64;

// The layer shapes of a batch of B images.
Conv2DShape conv1_shape(int64_t b) { return {b, kImageSide, kImageSide, 1, kConv1Filters, kKernel}; }
Pool2DShape pool1_shape(int64_t b) {
  const Conv2DShape c = conv1_shape(b);
  return {b, c.out_height(), c.out_width(), kConv1Filters};
}
Conv2DShape conv2_shape(int64_t b) {
  const Pool2DShape p = pool1_shape(b);
  return {b, p.out_height(), p.out_width(), kConv1Filters, kConv2Filters, kKernel};
}
Pool2DShape pool2_shape(int64_t b) {
  const Conv2DShape c = conv2_shape(b);
  return {b, c.out_height(), c.out_width(), kConv2Filters};
}
constexpr int64_t kFlat = 5 * 5 * kConv2Filters;  // pool2's output per image

std::string shape_string(const mirrored::Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

template <class T>
void check_params(const std::vector<mirrored::Tensor<T>>& params) {
  const auto shapes = param_shapes();
  const auto names = param_names();
  MIRRORED_ENFORCE(params.size() == shapes.size(), mirrored::InvalidArgumentError, "fashion CNN: ", params.size(),
                   " parameters given, expected ", shapes.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    MIRRORED_ENFORCE(params[i].shape() == shapes[i], mirrored::InvalidArgumentError, "fashion CNN: parameter ",
                     names[i], " has shape ", shape_string(params[i].shape()), ", expected ", shape_string(shapes[i]));
    MIRRORED_ENFORCE(params[i].device().is_host(), mirrored::InvalidArgumentError, "fashion CNN: parameter ", names[i],
                     " is on ", params[i].device().short_name(), "; the model computes in host memory");
  }
}

template <class T>
int64_t check_batch(const mirrored::Tensor<T>& x, const mirrored::Tensor<int32_t>* y) {
  MIRRORED_ENFORCE(x.rank() == 4 && x.shape()[1] == kImageSide && x.shape()[2] == kImageSide && x.shape()[3] == 1,
                   mirrored::InvalidArgumentError, "fashion CNN: images have shape ", shape_string(x.shape()),
                   ", expected (batch, 28, 28, 1)");
  MIRRORED_ENFORCE(x.device().is_host(), mirrored::InvalidArgumentError, "fashion CNN: images are on ",
                   x.device().short_name(), "; the model computes in host memory");
  const int64_t b = x.shape()[0];
  if (y) {
    MIRRORED_ENFORCE(y->rank() == 1 && y->shape()[0] == b, mirrored::InvalidArgumentError,
                     "fashion CNN: labels have shape ", shape_string(y->shape()), ", expected (", b, ",)");
    MIRRORED_ENFORCE(y->device().is_host(), mirrored::InvalidArgumentError, "fashion CNN: labels are on ",
                     y->device().short_name(), "; the model computes in host memory");
  }
  return b;
}

// The column sums of dy (rows, cols), row after row: each sum in row order whatever the buffers'
// alignment (Eigen's vectorised colwise().sum() adds in an order that depends on it, so two equal
// calls could differ in the last bit).
template <class T>
void column_sums(const T* dy, int64_t rows, int64_t cols, T* out) {
  RowVectorMap<T> sum(out, cols);
  sum.setZero();
  for (int64_t r = 0; r < rows; ++r) sum += ConstRowVectorMap<T>(dy + r * cols, cols);
}

// g where v > 0, else +0, by masking g's bits: y's sign is random, so a branch would be
// mispredicted half the time (and the compiler turns `v > 0 ? g : 0` into one).
template <class T>
T keep_if_positive(T g, T v) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  return std::bit_cast<T>(std::bit_cast<Bits>(g) & (Bits(0) - Bits(v > T(0))));
}

template <class V>
auto* sized(V& v, int64_t n) {
  v.resize(static_cast<std::size_t>(n));
  return v.data();
}

// The forward pass of a batch of b images into the workspace (a2: the second convolution's
// product before its bias; p1, p2: each convolution after bias, ReLU and pooling; a3: the dense layer's output after
// ReLU; cols2: its patches; at1: the first pool's positions; idx2: the second's argmax).
template <class T>
void forward(const std::vector<mirrored::Tensor<T>>& p, const T* x, int64_t b, CnnWorkspace<T>& ws) {
  const Conv2DShape c1 = conv1_shape(b), c2 = conv2_shape(b);
  const Pool2DShape p1 = pool1_shape(b), p2 = pool2_shape(b);
  // The first convolution directly with its pool; the second's bias and ReLU in its pooling pass.
  single_channel_conv_pool_forward(c1, x, p[kConv1Kernel].data(), p[kConv1Bias].data(), sized(ws.p1, p1.out_size()),
                                   sized(ws.at1, p1.out_size()));
  conv2d_forward<T>(c2, ws.p1.data(), p[kConv2Kernel].data(), nullptr, sized(ws.cols2, c2.rows() * c2.depth()),
                    sized(ws.a2, c2.rows() * c2.filters));
  bias_relu_max_pool_forward(p2, ws.a2.data(), p[kConv2Bias].data(), sized(ws.p2, p2.out_size()),
                             sized(ws.idx2, p2.out_size()));
  dense_forward(b, kFlat, kDenseUnits, ws.p2.data(), p[kDense1Kernel].data(), p[kDense1Bias].data(),
                sized(ws.a3, b * kDenseUnits));
  relu_forward(b * kDenseUnits, ws.a3.data());
  dense_forward(b, kDenseUnits, kClasses, ws.a3.data(), p[kDense2Kernel].data(), p[kDense2Bias].data(),
                sized(ws.logits, b * kClasses));
}

}  // namespace

std::vector<std::string> param_names() {
  return {"conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias",
          "dense/kernel",  "dense/bias",  "dense_1/kernel",  "dense_1/bias"};
}

std::vector<mirrored::Shape> param_shapes() {
  return {{kKernel, kKernel, 1, kConv1Filters},
          {kConv1Filters},
          {kKernel, kKernel, kConv1Filters, kConv2Filters},
          {kConv2Filters},
          {kFlat, kDenseUnits},
          {kDenseUnits},
          {kDenseUnits, kClasses},
          {kClasses}};
}

template <class T>
std::vector<mirrored::Tensor<T>> init_cnn(uint64_t seed) {
  std::mt19937 rng = examples::init_rng(seed);
  std::vector<mirrored::Tensor<T>> out;
  for (const mirrored::Shape& shape : param_shapes()) {
    if (shape.size() == 1) {
      out.push_back(mirrored::Tensor<T>::zeros(shape));
      continue;
    }
    // Keras' fans: a convolution's receptive field times its input and output channels.
    int64_t receptive = 1;
    for (std::size_t i = 0; i + 2 < shape.size(); ++i) receptive *= shape[i];
    const int64_t fan_in = receptive * shape[shape.size() - 2], fan_out = receptive * shape.back();
    out.push_back(examples::glorot_uniform<T>(rng, shape, fan_in, fan_out));
  }
  return out;
}

template <class T>
void im2col(const Conv2DShape& s, const T* x, T* cols) {
  const int64_t oh = s.out_height(), ow = s.out_width(), k = s.kernel, c = s.channels;
  const int64_t segment = k * c;  // one kernel row's patch: contiguous in NHWC
  T* dst = cols;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t r = 0; r < k; ++r, dst += segment) {
          const T* src = x + ((b * s.height + i + r) * s.width + j) * c;
          // A single-channel input's segment is three values: a call to memcpy would cost more.
          if (segment <= 8)
            for (int64_t e = 0; e < segment; ++e) dst[e] = src[e];
          else
            std::memcpy(dst, src, sizeof(T) * segment);
        }
}

template <class T>
void col2im(const Conv2DShape& s, const T* dcols, T* dx) {
  const int64_t oh = s.out_height(), ow = s.out_width(), k = s.kernel, c = s.channels;
  const int64_t segment = k * c;
  std::fill_n(dx, s.batch * s.height * s.width * c, T(0));
  const T* src = dcols;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j)
        for (int64_t r = 0; r < k; ++r, src += segment) {
          T* out = dx + ((b * s.height + i + r) * s.width + j) * c;
          for (int64_t e = 0; e < segment; ++e) out[e] += src[e];
        }
}

template <class T>
void conv2d_forward(const Conv2DShape& s, const T* x, const T* kernel, const T* bias, T* cols, T* y) {
  im2col(s, x, cols);
  MatrixMap<T> out(y, s.rows(), s.filters);
  out.noalias() = ConstMatrixMap<T>(cols, s.rows(), s.depth()) * ConstMatrixMap<T>(kernel, s.depth(), s.filters);
  if (bias) out.rowwise() += ConstRowVectorMap<T>(bias, s.filters);
}

template <class T>
void conv2d_backward(const Conv2DShape& s, const T* cols, const T* kernel, const T* dy, T* dkernel, T* dbias, T* dcols,
                     T* dx) {
  const ConstMatrixMap<T> grad(dy, s.rows(), s.filters);
  MatrixMap<T>(dkernel, s.depth(), s.filters).noalias() =
      ConstMatrixMap<T>(cols, s.rows(), s.depth()).transpose() * grad;
  column_sums(dy, s.rows(), s.filters, dbias);
  if (!dx) return;
  MatrixMap<T>(dcols, s.rows(), s.depth()).noalias() =
      grad * ConstMatrixMap<T>(kernel, s.depth(), s.filters).transpose();
  col2im(s, dcols, dx);
}

namespace {

// Calls visit(o, at, ch) for every output o of a 2x2 pool, in order: at[0..3] are the window's
// four positions in the input, each the start of a run of `channels` values, in row-major order
// (so that the first maximum is TF's), and ch the channel. \throws for indices past int32.
template <class Visit>
void for_each_pool_window(const Pool2DShape& s, Visit&& visit) {
  MIRRORED_ENFORCE(s.in_size() < (int64_t{1} << 31), mirrored::InvalidArgumentError, "max pool: ", s.in_size(),
                   " inputs, more than int32 indices reach; use smaller batches");
  const int64_t oh = s.out_height(), ow = s.out_width(), c = s.channels;
  int64_t o = 0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t top = ((b * s.height + 2 * i) * s.width + 2 * j) * c;
        const int64_t at[4] = {top, top + c, top + s.width * c, top + s.width * c + c};
        for (int64_t ch = 0; ch < c; ++ch, ++o) visit(o, at, ch);
      }
}

}  // namespace

template <class T>
void max_pool_forward(const Pool2DShape& s, const T* x, T* y, int32_t* argmax) {
  for_each_pool_window(s, [&](int64_t o, const int64_t(&at)[4], int64_t ch) {
    int64_t best = at[0] + ch;
    for (int w = 1; w < 4; ++w)
      if (x[at[w] + ch] > x[best]) best = at[w] + ch;
    y[o] = x[best];
    argmax[o] = static_cast<int32_t>(best);
  });
}

template <class T>
void max_pool_backward(const Pool2DShape& s, const T* dy, const int32_t* argmax, T* dx) {
  std::fill_n(dx, s.in_size(), T(0));
  const int64_t n = s.out_size();
  for (int64_t o = 0; o < n; ++o) dx[argmax[o]] += dy[o];
}

template <class T>
void bias_relu_max_pool_forward(const Pool2DShape& s, const T* x, const T* bias, T* y, int32_t* argmax) {
  for_each_pool_window(s, [&](int64_t o, const int64_t(&at)[4], int64_t ch) {
    int64_t best = at[0] + ch;
    T max = x[best] + bias[ch];
    for (int w = 1; w < 4; ++w) {
      const T v = x[at[w] + ch] + bias[ch];
      if (v > max) max = v, best = at[w] + ch;
    }
    y[o] = max > T(0) ? max : T(0);
    argmax[o] = static_cast<int32_t>(best);
  });
}

template <class T>
void relu_max_pool_backward(const Pool2DShape& s, const T* dy, const T* y, const int32_t* argmax, T* dx) {
  std::fill_n(dx, s.in_size(), T(0));
  const int64_t n = s.out_size();
  for (int64_t o = 0; o < n; ++o) dx[argmax[o]] = keep_if_positive(dy[o], y[o]);
}

template <class T>
void dense_forward(int64_t batch, int64_t in, int64_t out, const T* x, const T* w, const T* b, T* y) {
  MatrixMap<T> result(y, batch, out);
  result.noalias() = ConstMatrixMap<T>(x, batch, in) * ConstMatrixMap<T>(w, in, out);
  result.rowwise() += ConstRowVectorMap<T>(b, out);
}

template <class T>
void dense_backward(int64_t batch, int64_t in, int64_t out, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx) {
  const ConstMatrixMap<T> grad(dy, batch, out);
  MatrixMap<T>(dw, in, out).noalias() = ConstMatrixMap<T>(x, batch, in).transpose() * grad;
  column_sums(dy, batch, out, db);
  if (dx) MatrixMap<T>(dx, batch, in).noalias() = grad * ConstMatrixMap<T>(w, in, out).transpose();
}

template <class T>
void relu_forward(int64_t n, T* y) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> a(y, n);
  a = a.max(T(0));
}

template <class T>
void relu_backward(int64_t n, const T* y, T* dy) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> g(dy, n);
  g = (Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(y, n) > T(0)).select(g, T(0));
}

template <class T>
int64_t softmax_cross_entropy(int64_t batch, int64_t classes, const T* logits, const int32_t* labels, T* loss,
                              T* dlogits, T grad_scale) {
  int64_t correct = 0;
  std::vector<T> e(static_cast<std::size_t>(classes));
  for (int64_t i = 0; i < batch; ++i) {
    const int32_t label = labels[i];
    MIRRORED_ENFORCE(label >= 0 && label < classes, mirrored::InvalidArgumentError, "fashion CNN: label ", label,
                     " of example ", i, " is outside 0..", classes - 1);
    const T* row = logits + i * classes;
    int64_t arg = 0;
    for (int64_t k = 1; k < classes; ++k)
      if (row[k] > row[arg]) arg = k;
    correct += arg == label;
    const T max = row[arg];
    T sum = 0;
    for (int64_t k = 0; k < classes; ++k) sum += e[static_cast<std::size_t>(k)] = std::exp(row[k] - max);
    loss[i] = max + std::log(sum) - row[label];
    if (!dlogits) continue;
    T* d = dlogits + i * classes;
    for (int64_t k = 0; k < classes; ++k) d[k] = e[static_cast<std::size_t>(k)] / sum * grad_scale;
    d[label] -= grad_scale;
  }
  return correct;
}

template <class T>
mirrored::Tensor<T> cnn_logits(const std::vector<mirrored::Tensor<T>>& params, const mirrored::Tensor<T>& x,
                               CnnWorkspace<T>& ws) {
  check_params(params);
  const int64_t b = check_batch<T>(x, nullptr);
  forward(params, x.data(), b, ws);
  auto out = mirrored::Tensor<T>::empty({b, kClasses}, x.device());
  std::copy_n(ws.logits.data(), b * kClasses, out.data());
  return out;
}

template <class T>
CnnEval cnn_evaluate(const std::vector<mirrored::Tensor<T>>& params, const mirrored::Tensor<T>& x,
                     const mirrored::Tensor<int32_t>& y, CnnWorkspace<T>& ws) {
  check_params(params);
  const int64_t b = check_batch(x, &y);
  forward(params, x.data(), b, ws);
  CnnEval out;
  out.correct = softmax_cross_entropy<T>(b, kClasses, ws.logits.data(), y.data(), sized(ws.loss, b), nullptr, T(1));
  for (int64_t i = 0; i < b; ++i) out.loss_sum += ws.loss[static_cast<std::size_t>(i)];
  return out;
}

template <class T>
CnnStep<T> cnn_loss_and_grads(const std::vector<mirrored::Tensor<T>>& p, const mirrored::Tensor<T>& x,
                              const mirrored::Tensor<int32_t>& y, const LossScale& scale, CnnWorkspace<T>& ws,
                              const std::function<void(int, mirrored::Tensor<T>)>& on_gradient) {
  check_params(p);
  const int64_t b = check_batch(x, &y);
  MIRRORED_ENFORCE(scale.global_batch > 0 && scale.num_replicas > 0, mirrored::InvalidArgumentError,
                   "fashion CNN: the global batch (", scale.global_batch, ") and the replicas (", scale.num_replicas,
                   ") must be positive");
  forward(p, x.data(), b, ws);
  CnnStep<T> out;
  // d(sum of losses / global batch) / d(logits).
  out.correct = softmax_cross_entropy<T>(b, kClasses, ws.logits.data(), y.data(), sized(ws.loss, b),
                                         sized(ws.dlogits, b * kClasses), T(1) / static_cast<T>(scale.global_batch));
  const mirrored::Device& device = x.device();
  const auto shapes = param_shapes();
  // The L2 term of every kernel: l2 * sum(w^2) / replicas, and its gradient 2 * l2 / replicas * w.
  const T reg_grad = static_cast<T>(2 * scale.l2 / scale.num_replicas);
  double reg = 0;
  auto grad_of = [&](int param) { return mirrored::Tensor<T>::empty(shapes[static_cast<std::size_t>(param)], device); };
  auto hand_over = [&](int param, mirrored::Tensor<T> g) {
    if (is_kernel(param) && scale.l2 != 0) {
      const auto w = mirrored::as_vector(p[static_cast<std::size_t>(param)]);
      for (Eigen::Index i = 0; i < w.size(); ++i) reg += static_cast<double>(w[i]) * static_cast<double>(w[i]);
      mirrored::as_vector(g) += reg_grad * w;
    }
    on_gradient(param, std::move(g));
  };

  // dense_1
  auto dk = grad_of(kDense2Kernel), db = grad_of(kDense2Bias);
  dense_backward(b, kDenseUnits, kClasses, ws.a3.data(), p[kDense2Kernel].data(), ws.dlogits.data(), dk.data(),
                 db.data(), sized(ws.da3, b * kDenseUnits));
  hand_over(kDense2Kernel, std::move(dk));
  hand_over(kDense2Bias, std::move(db));
  // dense
  relu_backward(b * kDenseUnits, ws.a3.data(), ws.da3.data());
  dk = grad_of(kDense1Kernel), db = grad_of(kDense1Bias);
  dense_backward(b, kFlat, kDenseUnits, ws.p2.data(), p[kDense1Kernel].data(), ws.da3.data(), dk.data(), db.data(),
                 sized(ws.dp2, b * kFlat));
  hand_over(kDense1Kernel, std::move(dk));
  hand_over(kDense1Bias, std::move(db));
  // conv2d_1 (through the second pool)
  const Conv2DShape c1 = conv1_shape(b), c2 = conv2_shape(b);
  const Pool2DShape p1 = pool1_shape(b), p2 = pool2_shape(b);
  relu_max_pool_backward(p2, ws.dp2.data(), ws.p2.data(), ws.idx2.data(), sized(ws.da2, p2.in_size()));
  dk = grad_of(kConv2Kernel), db = grad_of(kConv2Bias);
  conv2d_backward(c2, ws.cols2.data(), p[kConv2Kernel].data(), ws.da2.data(), dk.data(), db.data(),
                  sized(ws.dcols2, c2.rows() * c2.depth()), sized(ws.dp1, p1.out_size()));
  hand_over(kConv2Kernel, std::move(dk));
  hand_over(kConv2Bias, std::move(db));
  // conv2d (through the first pool; the images need no gradient)
  dk = grad_of(kConv1Kernel), db = grad_of(kConv1Bias);
  single_channel_conv_pool_backward(c1, x.data(), ws.dp1.data(), ws.p1.data(), ws.at1.data(), dk.data(), db.data());
  hand_over(kConv1Kernel, std::move(dk));
  hand_over(kConv1Bias, std::move(db));

  // tf.nn.compute_average_loss(per_example_loss, global_batch) + scale_regularization_loss(l2 terms).
  auto per_example = mirrored::Tensor<T>::empty({b}, device);
  std::copy_n(ws.loss.data(), b, per_example.data());
  const T average = mirrored::nn::compute_average_loss(per_example, scale.global_batch).item();
  out.loss = average + static_cast<T>(scale.l2 * reg / scale.num_replicas);
  return out;
}

#define FASHION_INSTANTIATE(T)                                                                                    \
  template std::vector<mirrored::Tensor<T>> init_cnn<T>(uint64_t);                                                \
  template CnnStep<T> cnn_loss_and_grads<T>(const std::vector<mirrored::Tensor<T>>&, const mirrored::Tensor<T>&,  \
                                            const mirrored::Tensor<int32_t>&, const LossScale&, CnnWorkspace<T>&, \
                                            const std::function<void(int, mirrored::Tensor<T>)>&);                \
  template mirrored::Tensor<T> cnn_logits<T>(const std::vector<mirrored::Tensor<T>>&, const mirrored::Tensor<T>&, \
                                             CnnWorkspace<T>&);                                                   \
  template CnnEval cnn_evaluate<T>(const std::vector<mirrored::Tensor<T>>&, const mirrored::Tensor<T>&,           \
                                   const mirrored::Tensor<int32_t>&, CnnWorkspace<T>&);                           \
  template void im2col<T>(const Conv2DShape&, const T*, T*);                                                      \
  template void col2im<T>(const Conv2DShape&, const T*, T*);                                                      \
  template void conv2d_forward<T>(const Conv2DShape&, const T*, const T*, const T*, T*, T*);                      \
  template void conv2d_backward<T>(const Conv2DShape&, const T*, const T*, const T*, T*, T*, T*, T*);             \
  template void max_pool_forward<T>(const Pool2DShape&, const T*, T*, int32_t*);                                  \
  template void max_pool_backward<T>(const Pool2DShape&, const T*, const int32_t*, T*);                           \
  template void bias_relu_max_pool_forward<T>(const Pool2DShape&, const T*, const T*, T*, int32_t*);              \
  template void relu_max_pool_backward<T>(const Pool2DShape&, const T*, const T*, const int32_t*, T*);            \
  template void dense_forward<T>(int64_t, int64_t, int64_t, const T*, const T*, const T*, T*);                    \
  template void dense_backward<T>(int64_t, int64_t, int64_t, const T*, const T*, const T*, T*, T*, T*);           \
  template void relu_forward<T>(int64_t, T*);                                                                     \
  template void relu_backward<T>(int64_t, const T*, T*);                                                          \
  template int64_t softmax_cross_entropy<T>(int64_t, int64_t, const T*, const int32_t*, T*, T*, T);

FASHION_INSTANTIATE(float)
FASHION_INSTANTIATE(double)
#undef FASHION_INSTANTIATE

}  // namespace fashion
