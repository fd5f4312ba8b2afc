#pragma once
/// \file
/// The model of TensorFlow's tutorial "Custom training with tf.distribute.Strategy", forward and
/// backward with Eigen on host memory, one thread per call (a replica's thread: the replicas are
/// the parallelism):
///
///     x       (B, 28, 28, 1)    images in NHWC, as Keras
///     conv2d    Conv2D(32, 3, relu)   kernel (3, 3, 1, 32)   -> (B, 26, 26, 32)
///               MaxPooling2D(2)                               -> (B, 13, 13, 32)
///     conv2d_1  Conv2D(64, 3, relu)   kernel (3, 3, 32, 64)  -> (B, 11, 11, 64)
///               MaxPooling2D(2)                               -> (B, 5, 5, 64)
///               Flatten                                       -> (B, 1600)
///     dense     Dense(64, relu)       kernel (1600, 64)      -> (B, 64)
///     dense_1   Dense(10)             kernel (64, 10)        -> (B, 10) logits
///
/// Convolutions are VALID with stride 1, computed as im2col + one GEMM: the patch matrix
/// (B*OH*OW, 3*3*C) of row-major NHWC input times the kernel read as a (3*3*C, F) row-major matrix
/// gives the NHWC output without a transpose; the backward pass is two GEMMs (the kernel's gradient,
/// patches^T * dy, and the patches' gradient, dy * kernel^T, scattered back by col2im). Max pooling
/// is 2x2 with stride 2 (an odd last row or column is dropped, as Keras' VALID padding does); its
/// gradient goes to the first maximum of each window. The model runs conv2d_1 that way with its
/// bias and ReLU applied in the pooling pass, and conv2d, whose single input channel makes a
/// 9-column patch matrix, directly with its pool (`single_channel_conv_pool_forward`); the
/// layer-by-layer functions below are the reference the fused ones are tested against.
///
/// The loss of one replica is the tutorial's `compute_loss`: the sparse softmax cross-entropy of
/// its examples summed and divided by the global batch size (`tf.nn.compute_average_loss`), plus
/// L2 regularisation of every kernel (Keras' `L2(1e-5)`: 1e-5 * sum(w^2)) divided by the number of
/// replicas in sync (`tf.nn.scale_regularization_loss`). Summed over the replicas (the SUM
/// all-reduce of the gradients) that is the mean loss of the global batch plus the whole
/// regularisation. Everything is templated on the element type: float for training, double for
/// the gradient checks (tests/fashion/test_fashion_cnn.cpp); both are compiled in cnn.cpp.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mirrored/tensor.hpp>

namespace fashion {

/// The parameters in Keras' order (`model.trainable_variables`); `names()` and `shapes()` follow it.
enum Param : int {
  kConv1Kernel,
  kConv1Bias,
  kConv2Kernel,
  kConv2Bias,
  kDense1Kernel,
  kDense1Bias,
  kDense2Kernel,
  kDense2Bias,
  kNumParams
};

/// `conv2d/kernel`, `conv2d/bias`, `conv2d_1/kernel`, ... `dense_1/bias` (Keras' names).
std::vector<std::string> param_names();
/// (3, 3, 1, 32), (32,), (3, 3, 32, 64), (64,), (1600, 64), (64,), (64, 10), (10,).
std::vector<mirrored::Shape> param_shapes();
/// Whether parameter `p` is a kernel (regularised) rather than a bias.
inline bool is_kernel(int p) { return p % 2 == 0; }

/// Keras' defaults: Glorot-uniform kernels (fan_in = 3*3*C_in and fan_out = 3*3*C_out for a
/// convolution; inputs and units for a dense layer), drawn in Keras' order with
/// `examples::glorot_uniform` from `examples::init_rng(seed)`; zero biases.
template <class T = float>
std::vector<mirrored::Tensor<T>> init_cnn(uint64_t seed);

/// How one replica's loss is scaled (see the file comment).
struct LossScale {
  int64_t global_batch = 1;  ///< examples in this step over all replicas
  int num_replicas = 1;      ///< replicas in sync
  double l2 = 1e-5;          ///< Keras' L2 factor of every kernel
};

/// Buffers of one replica's passes, reused from step to step (one per replica thread).
template <class T>
struct CnnWorkspace {
  std::vector<T> p1, at1, cols2, a2, p2, a3, logits, loss;
  std::vector<T> dlogits, da3, dp2, da2, dcols2, dp1;
  std::vector<int32_t> idx2;
};

/// One replica's training step.
template <class T>
struct CnnStep {
  T loss = 0;           ///< this replica's share of the step's loss (see the file comment)
  int64_t correct = 0;  ///< examples whose argmax logit (the first on a tie) is the label
};

/// Forward and backward pass of a batch `x` (B, 28, 28, 1) with labels `y` (B,) in 0..9 (B may be
/// 0: then only the regularisation's gradient). Each parameter's gradient of this replica's loss is
/// handed to `on_gradient(param, gradient)` as soon as the backward pass has it -- the last
/// layer's first: dense_1's kernel and bias, dense's, conv2d_1's, conv2d's -- as a fresh tensor on
/// `x`'s device that nothing else refers to. \throws mirrored::InvalidArgumentError for a
/// parameter or batch of the wrong shape, or a label outside 0..9 (naming the example); for
/// tensors not in host memory.
template <class T>
CnnStep<T> cnn_loss_and_grads(const std::vector<mirrored::Tensor<T>>& params, const mirrored::Tensor<T>& x,
                              const mirrored::Tensor<int32_t>& y, const LossScale& scale, CnnWorkspace<T>& ws,
                              const std::function<void(int param, mirrored::Tensor<T> gradient)>& on_gradient);

/// The logits (B, 10) of a batch (the forward pass alone). \throws as `cnn_loss_and_grads`.
template <class T>
mirrored::Tensor<T> cnn_logits(const std::vector<mirrored::Tensor<T>>& params, const mirrored::Tensor<T>& x,
                               CnnWorkspace<T>& ws);

/// What the tutorial's test step measures on a batch.
struct CnnEval {
  double loss_sum = 0;  ///< the summed cross-entropy (no regularisation: Keras' `loss_object`)
  int64_t correct = 0;  ///< examples classified correctly
};
/// The tutorial's test step on a batch (the forward pass alone). \throws as `cnn_loss_and_grads`.
template <class T>
CnnEval cnn_evaluate(const std::vector<mirrored::Tensor<T>>& params, const mirrored::Tensor<T>& x,
                     const mirrored::Tensor<int32_t>& y, CnnWorkspace<T>& ws);

// The layers, on raw row-major buffers (the model above calls them; the gradient checks test
// each). Every output is overwritten, not added to.

/// A VALID, stride-1 convolution of a square kernel over NHWC input.
struct Conv2DShape {
  int64_t batch = 0, height = 0, width = 0, channels = 0, filters = 0, kernel = 3;
  int64_t out_height() const { return height - kernel + 1; }
  int64_t out_width() const { return width - kernel + 1; }
  int64_t rows() const { return batch * out_height() * out_width(); }  ///< of the patch matrix
  int64_t depth() const { return kernel * kernel * channels; }         ///< its columns
};
/// The patch matrix (rows(), depth()) of `x` (batch, height, width, channels).
template <class T>
void im2col(const Conv2DShape& s, const T* x, T* cols);
/// The gradient of `x` from that of its patch matrix (the sum of every patch's share).
template <class T>
void col2im(const Conv2DShape& s, const T* dcols, T* dx);
/// y (rows(), filters) = patches(x) * kernel + bias (or without a bias when `bias` is null: for
/// `bias_relu_max_pool_forward` to add); `cols` receives the patches (for the backward pass).
template <class T>
void conv2d_forward(const Conv2DShape& s, const T* x, const T* kernel, const T* bias, T* cols, T* y);
/// From dy (rows(), filters) and the forward pass's patches: dkernel (depth(), filters), dbias
/// (filters), and, when `dx` is not null, dx (batch, height, width, channels) through `dcols`
/// (rows(), depth()).
template <class T>
void conv2d_backward(const Conv2DShape& s, const T* cols, const T* kernel, const T* dy, T* dkernel, T* dbias, T* dcols,
                     T* dx);

/// The first layer's 3x3 convolution of single-channel images (`s.channels == 1`, `s.filters` a
/// multiple of 8) with its bias, ReLU and 2x2 pooling, computed directly
/// rather than as im2col + GEMM + `bias_relu_max_pool_forward`: with one input channel the patch
/// matrix has 9 columns, too few for a GEMM to pay off, and the full-size convolution output
/// (four times the pooled one) is never written. y is what that path gives (each output the
/// kernel's products summed in its order, then the bias, then the first maximum and ReLU);
/// `position` receives each maximum's place in its window, 0..3 row-major, as a T (so that the
/// selects vectorise). \throws mirrored::InvalidArgumentError for another shape.
template <class T>
void single_channel_conv_pool_forward(const Conv2DShape& s, const T* x, const T* kernel, const T* bias, T* y,
                                      T* position);
/// Its kernel's and bias's gradients from dy (the pooled output's gradient) and the forward
/// pass's y and position: the gradient reaches only each window's maximum where y > 0, so only
/// those products are summed (an image at a time, then over the images), with no full-size
/// gradient in between. The images need no gradient. \throws as the forward pass.
template <class T>
void single_channel_conv_pool_backward(const Conv2DShape& s, const T* x, const T* dy, const T* y, const T* position,
                                       T* dkernel, T* dbias);

/// 2x2 max pooling with stride 2 over NHWC input.
struct Pool2DShape {
  int64_t batch = 0, height = 0, width = 0, channels = 0;
  int64_t out_height() const { return height / 2; }
  int64_t out_width() const { return width / 2; }
  int64_t out_size() const { return batch * out_height() * out_width() * channels; }
  int64_t in_size() const { return batch * height * width * channels; }
};
/// y = the window maxima; `argmax` receives the index in `x` of each (the first on a tie).
template <class T>
void max_pool_forward(const Pool2DShape& s, const T* x, T* y, int32_t* argmax);
/// dx: dy at each window's argmax, zero elsewhere.
template <class T>
void max_pool_backward(const Pool2DShape& s, const T* dy, const int32_t* argmax, T* dx);

/// A convolution's bias, ReLU and pooling in one pass over its output `x` (before the bias):
/// y = max_pool(relu(x + bias)), computed as relu(max(x + bias)) -- ReLU is monotone, so the
/// values are those of the three layers in turn, bitwise, and x + bias is rounded as the bias
/// layer rounds it. `argmax` receives the first maximum of x + bias (the three layers' argmax
/// where y > 0; elsewhere the gradient is zero either way). Saves the full-size activation's
/// bias and ReLU passes.
template <class T>
void bias_relu_max_pool_forward(const Pool2DShape& s, const T* x, const T* bias, T* y, int32_t* argmax);
/// The gradient of `bias_relu_max_pool_forward` with respect to x (= to x + bias): dy where
/// y > 0 at each window's argmax, zero elsewhere (the odd row and column dropped by the pool
/// included) -- dx zeroed, then the masked gradient scattered without a branch, no separate ReLU
/// pass.
template <class T>
void relu_max_pool_backward(const Pool2DShape& s, const T* dy, const T* y, const int32_t* argmax, T* dx);

/// y (batch, out) = x (batch, in) * w (in, out) + b.
template <class T>
void dense_forward(int64_t batch, int64_t in, int64_t out, const T* x, const T* w, const T* b, T* y);
/// dw = x^T dy, db = the column sums of dy, and dx = dy w^T when `dx` is not null.
template <class T>
void dense_backward(int64_t batch, int64_t in, int64_t out, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx);

/// y = max(y, 0) in place.
template <class T>
void relu_forward(int64_t n, T* y);
/// dy *= (y > 0), with y the ReLU's output (its gradient at 0 is 0, as TF's).
template <class T>
void relu_backward(int64_t n, const T* y, T* dy);

/// Per-example sparse softmax cross-entropy of logits (batch, classes): `loss[i]`, and, when
/// `dlogits` is not null, its gradient softmax - onehot times `grad_scale`. Returns the examples
/// whose first maximal logit is the label. \throws mirrored::InvalidArgumentError for a label
/// outside 0..classes-1.
template <class T>
int64_t softmax_cross_entropy(int64_t batch, int64_t classes, const T* logits, const int32_t* labels, T* loss,
                              T* dlogits, T grad_scale);

}  // namespace fashion
