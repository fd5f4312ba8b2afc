#pragma once
/// \file
/// The digits model: a 64-64-10 multilayer perceptron (ReLU hidden layer, softmax cross-entropy
/// loss), forward and backward on one batch with Eigen on host tensors. Header-only.
///
///     hidden = relu(x @ w1 + b1)        x: (B, 64)   w1: (64, 64)  b1: (64,)
///     logits = hidden @ w2 + b2                      w2: (64, 10)  b2: (10,)
///     loss_i = logsumexp(logits_i) - logits_i[y_i]
///
/// Gradients are SUMMED over the batch (not averaged), so that a distributed step can all-reduce
/// (SUM) them and divide by the global batch size, as `tf.nn.compute_average_loss` does for losses.
/// Everything is templated on the element type (float for training, double for gradient checks).

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include <mirrored/eigen.hpp>
#include <mirrored/errors.hpp>
#include <mirrored/tensor.hpp>

#include "common/glorot.hpp"

namespace digits {

/// A shape as Python prints a tuple: `(64, 10)`, `(9,)`, `()`.
inline std::string shape_string(const mirrored::Shape& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + (shape.size() == 1 ? ",)" : ")");
}

/// Layer sizes.
inline constexpr int64_t kMlpInputs = 64;
inline constexpr int64_t kMlpHidden = 64;
inline constexpr int64_t kMlpOutputs = 10;

/// The parameters (or their gradients: the same shapes).
template <class T>
struct MlpParamsT {
  mirrored::Tensor<T> w1;  ///< (64, 64): input x hidden
  mirrored::Tensor<T> b1;  ///< (64,)
  mirrored::Tensor<T> w2;  ///< (64, 10): hidden x output
  mirrored::Tensor<T> b2;  ///< (10,)

  /// Names for checkpoints and printing, in the order of `tensors()`: Keras-style
  /// `dense/kernel`, `dense/bias`, `dense_1/kernel`, `dense_1/bias`.
  static std::vector<std::string> names() { return {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"}; }
  /// Handles to the four tensors (sharing storage), in the order of `names()`.
  std::vector<mirrored::Tensor<T>> tensors() const { return {w1, b1, w2, b2}; }
  /// The shapes, in the order of `names()`.
  static std::vector<mirrored::Shape> shapes() {
    return {{kMlpInputs, kMlpHidden}, {kMlpHidden}, {kMlpHidden, kMlpOutputs}, {kMlpOutputs}};
  }

  /// All zeros (e.g. to accumulate gradients).
  static MlpParamsT zeros() {
    return {mirrored::Tensor<T>::zeros({kMlpInputs, kMlpHidden}), mirrored::Tensor<T>::zeros({kMlpHidden}),
            mirrored::Tensor<T>::zeros({kMlpHidden, kMlpOutputs}), mirrored::Tensor<T>::zeros({kMlpOutputs})};
  }
};
using MlpParams = MlpParamsT<float>;

/// Glorot (Xavier) uniform initialisation, the same on every platform for a seed: kernels drawn
/// from U(-limit, limit) with limit = sqrt(6 / (fan_in + fan_out)), biases zero (Keras' defaults).
/// The uniform draws use `std::mt19937` and explicit arithmetic (the standard distributions differ
/// between standard libraries): u = (draw + 0.5) / 2^32, value = limit * (2u - 1), in double, then
/// converted to T (examples::glorot_uniform). w1 is drawn first (row-major), then w2.
template <class T = float>
MlpParamsT<T> init_mlp(uint64_t seed) {
  std::mt19937 rng = examples::init_rng(seed);
  MlpParamsT<T> p;
  p.w1 = examples::glorot_uniform<T>(rng, {kMlpInputs, kMlpHidden}, kMlpInputs, kMlpHidden);
  p.b1 = mirrored::Tensor<T>::zeros({kMlpHidden});
  p.w2 = examples::glorot_uniform<T>(rng, {kMlpHidden, kMlpOutputs}, kMlpHidden, kMlpOutputs);
  p.b2 = mirrored::Tensor<T>::zeros({kMlpOutputs});
  return p;
}

namespace mlp_detail {

template <class T>
using Matrix = mirrored::RowMatrix<T>;
template <class T>
using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

template <class T>
void check_params(const MlpParamsT<T>& p) {
  const auto names = MlpParamsT<T>::names();
  const auto shapes = MlpParamsT<T>::shapes();
  const auto tensors = p.tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    MIRRORED_ENFORCE(tensors[i].shape() == shapes[i], mirrored::InvalidArgumentError, "digits MLP: parameter ",
                     names[i], " has shape ", shape_string(tensors[i].shape()), ", expected ", shape_string(shapes[i]));
}

template <class T>
void check_batch(const mirrored::Tensor<T>& x, const mirrored::Tensor<int32_t>* y) {
  MIRRORED_ENFORCE(x.rank() == 2 && x.shape()[1] == kMlpInputs, mirrored::InvalidArgumentError,
                   "digits MLP: features have shape ", shape_string(x.shape()), ", expected (batch, ", kMlpInputs, ")");
  if (!y) return;
  MIRRORED_ENFORCE(y->rank() == 1 && y->shape()[0] == x.shape()[0], mirrored::InvalidArgumentError,
                   "digits MLP: labels have shape ", shape_string(y->shape()), ", expected (", x.shape()[0], ",)");
}

/// The forward pass: pre-activations of the hidden layer and the logits.
template <class T>
struct Forward {
  Matrix<T> z1;      // (B, 64)
  Matrix<T> hidden;  // (B, 64)
  Matrix<T> logits;  // (B, 10)
};

template <class T>
Forward<T> forward(const MlpParamsT<T>& p, const mirrored::Tensor<T>& x) {
  check_params(p);
  check_batch<T>(x, nullptr);
  const auto X = mirrored::as_matrix(x);
  const auto W1 = mirrored::as_matrix(p.w1);
  const auto W2 = mirrored::as_matrix(p.w2);
  const auto b1 = mirrored::as_vector(p.b1).transpose();
  const auto b2 = mirrored::as_vector(p.b2).transpose();
  Forward<T> f;
  f.z1 = X * W1;
  f.z1.rowwise() += b1;
  f.hidden = f.z1.cwiseMax(T(0));
  f.logits = f.hidden * W2;
  f.logits.rowwise() += b2;
  return f;
}

template <class T>
mirrored::Tensor<T> to_tensor(const Matrix<T>& m, const mirrored::Device& d = mirrored::cpu0) {
  auto t = mirrored::Tensor<T>::empty({m.rows(), m.cols()}, d);
  mirrored::as_matrix(t) = m;
  return t;
}

template <class T>
mirrored::Tensor<T> to_tensor(const RowVector<T>& v, const mirrored::Device& d = mirrored::cpu0) {
  auto t = mirrored::Tensor<T>::empty({v.cols()}, d);
  mirrored::as_vector(t) = v.transpose();
  return t;
}

}  // namespace mlp_detail

/// The logits `(B, 10)` of a batch `x` `(B, 64)`.
/// \throws mirrored::InvalidArgumentError for a wrong shape; for tensors not in host memory.
template <class T>
mirrored::Tensor<T> mlp_logits(const MlpParamsT<T>& params, const mirrored::Tensor<T>& x) {
  return mlp_detail::to_tensor<T>(mlp_detail::forward(params, x).logits);
}

/// The predicted class (argmax of the logits, the first on a tie) of each example.
template <class T>
std::vector<int32_t> mlp_predict(const MlpParamsT<T>& params, const mirrored::Tensor<T>& x) {
  const auto logits = mlp_detail::forward(params, x).logits;
  std::vector<int32_t> out(static_cast<std::size_t>(logits.rows()));
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    Eigen::Index arg = 0;
    logits.row(i).maxCoeff(&arg);
    out[static_cast<std::size_t>(i)] = static_cast<int32_t>(arg);
  }
  return out;
}

/// How many examples of the batch are classified correctly.
template <class T>
int64_t mlp_correct(const MlpParamsT<T>& params, const mirrored::Tensor<T>& x, const mirrored::Tensor<int32_t>& y) {
  mlp_detail::check_batch(x, &y);
  const auto pred = mlp_predict(params, x);
  const auto labels = y.to_vector();
  int64_t correct = 0;
  for (std::size_t i = 0; i < pred.size(); ++i) correct += pred[i] == labels[i];
  return correct;
}

/// The fraction of examples classified correctly (0 for an empty batch).
template <class T>
double mlp_accuracy(const MlpParamsT<T>& params, const mirrored::Tensor<T>& x, const mirrored::Tensor<int32_t>& y) {
  const int64_t n = x.rank() == 2 ? x.shape()[0] : 0;
  const int64_t correct = mlp_correct(params, x, y);
  return n ? static_cast<double>(correct) / static_cast<double>(n) : 0.0;
}

/// What one forward and backward pass over a batch gives.
template <class T>
struct MlpStepT {
  /// `(B,)` softmax cross-entropy of each example.
  mirrored::Tensor<T> per_example_loss;
  /// Gradients of the SUM of the per-example losses (divide by the global batch size for the mean).
  MlpParamsT<T> grads;
  /// Examples of the batch whose argmax prediction equals the label (before the update).
  int64_t correct = 0;
};
using MlpStep = MlpStepT<float>;

/// Forward and backward pass on a batch: `x` `(B, 64)`, `y` `(B,)` labels in 0..9. The loss and
/// the gradients are on `x`'s device (host memory: `CPU:k`), so that a replica's gradients are its
/// own without a copy.
/// \throws mirrored::InvalidArgumentError for a wrong shape or a label outside 0..9; for tensors not
/// in host memory.
template <class T>
MlpStepT<T> mlp_loss_and_grads(const MlpParamsT<T>& params, const mirrored::Tensor<T>& x,
                               const mirrored::Tensor<int32_t>& y) {
  using mlp_detail::Matrix;
  using mlp_detail::RowVector;
  mlp_detail::check_batch(x, &y);
  const auto f = mlp_detail::forward(params, x);
  const Eigen::Index batch = f.logits.rows();
  const std::vector<int32_t> labels = y.to_vector();

  // Loss and d(loss_i)/d(logits_i) = softmax(logits_i) - onehot(y_i), stably.
  std::vector<T> loss(static_cast<std::size_t>(batch));
  Matrix<T> dlogits(batch, kMlpOutputs);
  int64_t correct = 0;
  RowVector<T> e(kMlpOutputs);  // one row's exp(logits - max), allocated once
  for (Eigen::Index i = 0; i < batch; ++i) {
    const int32_t label = labels[static_cast<std::size_t>(i)];
    MIRRORED_ENFORCE(label >= 0 && label < kMlpOutputs, mirrored::InvalidArgumentError, "digits MLP: label ", label,
                     " of example ", i, " is outside 0..", kMlpOutputs - 1);
    Eigen::Index arg = 0;
    const T max = f.logits.row(i).maxCoeff(&arg);
    correct += arg == label;
    e = (f.logits.row(i).array() - max).exp().matrix();
    const T sum = e.sum();
    loss[static_cast<std::size_t>(i)] = max + std::log(sum) - f.logits(i, label);
    dlogits.row(i) = e / sum;
    dlogits(i, label) -= T(1);
  }

  const auto X = mirrored::as_matrix(x);
  const auto W2 = mirrored::as_matrix(params.w2);
  const Matrix<T> dz1 = ((dlogits * W2.transpose()).array() * (f.z1.array() > T(0)).template cast<T>()).matrix();

  const mirrored::Device& device = x.device();
  MlpStepT<T> out;
  out.per_example_loss = mirrored::Tensor<T>::from_vector(std::move(loss), {static_cast<int64_t>(batch)}, device);
  out.grads.w1 = mlp_detail::to_tensor<T>(Matrix<T>(X.transpose() * dz1), device);
  out.grads.b1 = mlp_detail::to_tensor<T>(RowVector<T>(dz1.colwise().sum()), device);
  out.grads.w2 = mlp_detail::to_tensor<T>(Matrix<T>(f.hidden.transpose() * dlogits), device);
  out.grads.b2 = mlp_detail::to_tensor<T>(RowVector<T>(dlogits.colwise().sum()), device);
  out.correct = correct;
  return out;
}

}  // namespace digits
