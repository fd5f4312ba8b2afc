// The Fashion-MNIST model's layers (examples/fashion/cnn.hpp): each backward pass against central
// finite differences in double, each forward pass against a direct loop, and the whole model's
// gradients (the L2 term and its scaling included) against finite differences of its loss.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "fashion/cnn.hpp"

namespace fashion {
namespace {

using Vec = std::vector<double>;

Vec random_vec(std::mt19937& rng, int64_t n, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d(objective)/dx by central differences (x is put back).
template <class F>
double central_difference(double& x, F objective) {
  constexpr double h = 1e-6;
  const double keep = x;
  x = keep + h;
  const double up = objective();
  x = keep - h;
  const double down = objective();
  x = keep;
  return (up - down) / (2 * h);
}

// Checks d(objective)/d(x[i]) == analytic[i] for every i.
template <class F>
void expect_gradient(Vec& x, const Vec& analytic, F objective, const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double fd = central_difference(x[i], objective);
    EXPECT_NEAR(analytic[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << what << "[" << i << "]";
  }
}

TEST(FashionCnnLayers, ConvolutionForwardIsTheDirectSum) {
  std::mt19937 rng(1);
  const Conv2DShape s{2, 5, 6, 3, 4, 3};
  const Vec x = random_vec(rng, s.batch * s.height * s.width * s.channels);
  const Vec k = random_vec(rng, s.depth() * s.filters), b = random_vec(rng, s.filters);
  Vec cols(static_cast<std::size_t>(s.rows() * s.depth())), y(static_cast<std::size_t>(s.rows() * s.filters));
  conv2d_forward(s, x.data(), k.data(), b.data(), cols.data(), y.data());
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t i = 0; i < s.out_height(); ++i)
      for (int64_t j = 0; j < s.out_width(); ++j)
        for (int64_t f = 0; f < s.filters; ++f) {
          double want = b[f];
          for (int64_t r = 0; r < 3; ++r)
            for (int64_t c = 0; c < 3; ++c)
              for (int64_t ch = 0; ch < s.channels; ++ch)
                want += x[((n * s.height + i + r) * s.width + j + c) * s.channels + ch] *
                        k[((r * 3 + c) * s.channels + ch) * s.filters + f];
          EXPECT_NEAR(y[((n * s.out_height() + i) * s.out_width() + j) * s.filters + f], want, 1e-12);
        }
}

TEST(FashionCnnLayers, ConvolutionBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const Conv2DShape s{2, 5, 6, 3, 4, 3};
  Vec x = random_vec(rng, s.batch * s.height * s.width * s.channels);
  Vec k = random_vec(rng, s.depth() * s.filters), b = random_vec(rng, s.filters);
  const Vec weight = random_vec(rng, s.rows() * s.filters);  // objective: sum(weight * y)
  Vec cols(static_cast<std::size_t>(s.rows() * s.depth())), y(weight.size());
  auto objective = [&] {
    conv2d_forward(s, x.data(), k.data(), b.data(), cols.data(), y.data());
    return dot(weight, y);
  };
  objective();
  Vec dk(k.size()), db(b.size()), dcols(cols.size()), dx(x.size());
  conv2d_backward(s, cols.data(), k.data(), weight.data(), dk.data(), db.data(), dcols.data(), dx.data());
  expect_gradient(k, dk, objective, "dkernel");
  expect_gradient(b, db, objective, "dbias");
  expect_gradient(x, dx, objective, "dx");
  // Without dx (the first layer): the same kernel and bias gradients, nothing else written.
  Vec dk2(k.size()), db2(b.size());
  objective();
  conv2d_backward<double>(s, cols.data(), k.data(), weight.data(), dk2.data(), db2.data(), nullptr, nullptr);
  EXPECT_EQ(dk2, dk);
  EXPECT_EQ(db2, db);
}

TEST(FashionCnnLayers, MaxPoolDropsTheOddRowAndRoutesTheGradientToTheMaximum) {
  std::mt19937 rng(3);
  const Pool2DShape s{2, 5, 4, 3};  // 5 rows: the last is dropped, as Keras' VALID pooling does
  Vec x = random_vec(rng, s.in_size());
  Vec y(static_cast<std::size_t>(s.out_size()));
  std::vector<int32_t> argmax(y.size());
  max_pool_forward(s, x.data(), y.data(), argmax.data());
  EXPECT_EQ(s.out_height(), 2);
  for (int64_t n = 0; n < s.batch; ++n)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t c = 0; c < 3; ++c) {
          double want = -1e9;
          for (int64_t r = 0; r < 2; ++r)
            for (int64_t q = 0; q < 2; ++q) want = std::max(want, x[((n * 5 + 2 * i + r) * 4 + 2 * j + q) * 3 + c]);
          EXPECT_EQ(y[((n * 2 + i) * 2 + j) * 3 + c], want);
        }
  const Vec weight = random_vec(rng, s.out_size());
  Vec dx(x.size(), 7.0);  // overwritten, not added to
  max_pool_backward(s, weight.data(), argmax.data(), dx.data());
  expect_gradient(
      x, dx,
      [&] {
        max_pool_forward(s, x.data(), y.data(), argmax.data());
        return dot(weight, y);
      },
      "dx");
  // A tie goes to the window's first position (row-major), as TF's.
  Vec flat(static_cast<std::size_t>(Pool2DShape{1, 2, 2, 1}.in_size()), 0.5);
  double out = 0;
  int32_t at = -1;
  max_pool_forward(Pool2DShape{1, 2, 2, 1}, flat.data(), &out, &at);
  EXPECT_EQ(at, 0);
}

// The layers as the model called them before they were fused: a convolution's bias, ReLU and
// pooling in turn over its full-size output.
struct Unfused {
  Vec y, dx;
  std::vector<int32_t> argmax;
};
Unfused bias_relu_pool_in_turn(const Pool2DShape& s, Vec a, const Vec& bias, const Vec& dy) {
  for (int64_t e = 0; e < s.in_size(); ++e) a[e] += bias[e % s.channels];
  relu_forward(s.in_size(), a.data());
  Unfused out{Vec(static_cast<std::size_t>(s.out_size())), Vec(a.size()),
              std::vector<int32_t>(static_cast<std::size_t>(s.out_size()))};
  max_pool_forward(s, a.data(), out.y.data(), out.argmax.data());
  max_pool_backward(s, dy.data(), out.argmax.data(), out.dx.data());
  relu_backward(s.in_size(), a.data(), out.dx.data());
  return out;
}

TEST(FashionCnnLayers, BiasReluAndPoolInOnePassAreTheThreeLayersBitwise) {
  std::mt19937 rng(11);
  const Pool2DShape s{2, 7, 5, 3};  // odd rows and columns: the pool drops the last of each
  Vec a = random_vec(rng, s.in_size());
  a[0] = a[3] = 0.25;  // a tie in the first window of channel 0 (positions 0 and 1)
  for (int64_t e = 0; e < 4 * s.channels; ++e) a[e + 2 * s.width * s.channels] = -2;  // negative windows
  const Vec bias = random_vec(rng, s.channels), dy = random_vec(rng, s.out_size());
  const Unfused want = bias_relu_pool_in_turn(s, a, bias, dy);
  Vec y(want.y.size()), dx(a.size(), 7.0);  // dx overwritten everywhere, not added to
  std::vector<int32_t> argmax(want.argmax.size());
  bias_relu_max_pool_forward(s, a.data(), bias.data(), y.data(), argmax.data());
  relu_max_pool_backward(s, dy.data(), y.data(), argmax.data(), dx.data());
  EXPECT_EQ(y, want.y);
  EXPECT_EQ(dx, want.dx);
  for (std::size_t o = 0; o < y.size(); ++o) {
    if (y[o] > 0) {
      EXPECT_EQ(argmax[o], want.argmax[o]) << o;  // elsewhere no gradient flows either way
    }
  }
}

TEST(FashionCnnLayers, SingleChannelConvolutionWithItsPoolIsTheGemmPath) {
  std::mt19937 rng(12);
  const Conv2DShape c{2, 9, 8, 1, 16, 3};  // a 7x6 output: the pool drops its last row
  const Pool2DShape p{c.batch, c.out_height(), c.out_width(), c.filters};
  Vec x = random_vec(rng, c.batch * c.height * c.width);
  std::fill_n(x.begin() + c.height * c.width, 4 * c.width, 0.5);  // flat rows: four equal outputs tie
  const Vec k = random_vec(rng, c.depth() * c.filters), bias = random_vec(rng, c.filters);
  const Vec dy = random_vec(rng, p.out_size());
  // The GEMM path: im2col + GEMM, then the bias, ReLU and pool in turn.
  Vec cols(static_cast<std::size_t>(c.rows() * c.depth())), a(static_cast<std::size_t>(p.in_size()));
  conv2d_forward<double>(c, x.data(), k.data(), nullptr, cols.data(), a.data());
  const Unfused want = bias_relu_pool_in_turn(p, a, bias, dy);
  Vec want_dk(k.size()), want_db(bias.size());
  conv2d_backward<double>(c, cols.data(), k.data(), want.dx.data(), want_dk.data(), want_db.data(), nullptr, nullptr);

  Vec y(want.y.size()), position(want.y.size()), dk(k.size(), 7.0), db(bias.size(), 7.0);
  single_channel_conv_pool_forward(c, x.data(), k.data(), bias.data(), y.data(), position.data());
  single_channel_conv_pool_backward(c, x.data(), dy.data(), y.data(), position.data(), dk.data(), db.data());
  for (std::size_t o = 0; o < y.size(); ++o) {
    EXPECT_NEAR(y[o], want.y[o], 1e-14) << o;
    if (want.y[o] <= 0) continue;
    // The position in its window of the GEMM path's argmax (row-major).
    const int64_t f = static_cast<int64_t>(o) % c.filters;
    const int64_t pixel = want.argmax[o] / c.filters % (p.height * p.width);  // in its image
    const int64_t j = (static_cast<int64_t>(o) / c.filters) % p.out_width();
    const int64_t i = (static_cast<int64_t>(o) / c.filters / p.out_width()) % p.out_height();
    const int64_t at = (pixel / p.width - 2 * i) * 2 + (pixel % p.width - 2 * j);
    EXPECT_EQ(position[o], static_cast<double>(at)) << o << " (filter " << f << ")";
  }
  for (std::size_t e = 0; e < dk.size(); ++e) EXPECT_NEAR(dk[e], want_dk[e], 1e-12) << e;
  for (std::size_t e = 0; e < db.size(); ++e) EXPECT_NEAR(db[e], want_db[e], 1e-12) << e;
  // The tied window (four equal outputs) goes to its first position, as the pool's first maximum.
  const std::size_t tied = static_cast<std::size_t>(p.out_height() * p.out_width() * c.filters);
  EXPECT_EQ(position[tied], 0.0);

  std::vector<float> xf(x.begin(), x.end()), kf(k.begin(), k.end()), bf(bias.begin(), bias.end());
  std::vector<float> yf(y.size()), pf(y.size());
  single_channel_conv_pool_forward<float>(c, xf.data(), kf.data(), bf.data(), yf.data(), pf.data());
  for (std::size_t o = 0; o < y.size(); ++o) EXPECT_NEAR(yf[o], y[o], 1e-5) << o;  // floats: 8 to a vector

  Conv2DShape rgb = c;
  rgb.channels = 3;
  EXPECT_THROW(single_channel_conv_pool_forward(rgb, x.data(), k.data(), bias.data(), y.data(), position.data()),
               mirrored::InvalidArgumentError);
  Conv2DShape odd = c;
  odd.filters = 12;
  EXPECT_THROW(
      single_channel_conv_pool_backward(odd, x.data(), dy.data(), y.data(), position.data(), dk.data(), db.data()),
      mirrored::InvalidArgumentError);
}

TEST(FashionCnnLayers, DenseBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  const int64_t batch = 3, in = 5, out = 4;
  Vec x = random_vec(rng, batch * in), w = random_vec(rng, in * out), b = random_vec(rng, out);
  const Vec weight = random_vec(rng, batch * out);
  Vec y(weight.size());
  auto objective = [&] {
    dense_forward(batch, in, out, x.data(), w.data(), b.data(), y.data());
    return dot(weight, y);
  };
  objective();
  EXPECT_NEAR(y[1 * out + 2], b[2] + x[5] * w[2] + x[6] * w[6] + x[7] * w[10] + x[8] * w[14] + x[9] * w[18], 1e-12);
  Vec dw(w.size()), db(b.size()), dx(x.size());
  dense_backward(batch, in, out, x.data(), w.data(), weight.data(), dw.data(), db.data(), dx.data());
  expect_gradient(w, dw, objective, "dw");
  expect_gradient(b, db, objective, "db");
  expect_gradient(x, dx, objective, "dx");
}

TEST(FashionCnnLayers, ReluPassesTheGradientOnlyWherePositive) {
  Vec y = {-2, 0, 3, -0.5, 1e-300};
  relu_forward(static_cast<int64_t>(y.size()), y.data());
  EXPECT_EQ(y, (Vec{0, 0, 3, 0, 1e-300}));
  Vec dy = {1, 2, 3, 4, 5};
  relu_backward(static_cast<int64_t>(y.size()), y.data(), dy.data());
  EXPECT_EQ(dy, (Vec{0, 0, 3, 0, 5}));  // TF's gradient at 0 is 0
}

TEST(FashionCnnLayers, SoftmaxCrossEntropyAndItsGradient) {
  std::mt19937 rng(5);
  const int64_t batch = 3, classes = 4;
  Vec logits = random_vec(rng, batch * classes, -3, 3);
  const std::vector<int32_t> labels = {2, 0, 3};
  Vec loss(batch), d(logits.size());
  const double scale = 0.25;
  softmax_cross_entropy<double>(batch, classes, logits.data(), labels.data(), loss.data(), d.data(), scale);
  for (int64_t i = 0; i < batch; ++i) {
    double z = 0;
    for (int64_t k = 0; k < classes; ++k) z += std::exp(logits[i * classes + k]);
    EXPECT_NEAR(loss[i], std::log(z) - logits[i * classes + labels[i]], 1e-12);
  }
  expect_gradient(
      logits, d,
      [&] {
        Vec l(batch);
        softmax_cross_entropy<double>(batch, classes, logits.data(), labels.data(), l.data(), nullptr, 1.0);
        return scale * (l[0] + l[1] + l[2]);
      },
      "dlogits");
  // The correct count: the first maximal logit against the label.
  const Vec tie = {1, 5, 5, 0};
  const std::vector<int32_t> first = {1}, second = {2};
  double l = 0;
  EXPECT_EQ(softmax_cross_entropy<double>(1, 4, tie.data(), first.data(), &l, nullptr, 1.0), 1);
  EXPECT_EQ(softmax_cross_entropy<double>(1, 4, tie.data(), second.data(), &l, nullptr, 1.0), 0);
  const std::vector<int32_t> bad = {4};
  EXPECT_THROW(softmax_cross_entropy<double>(1, 4, tie.data(), bad.data(), &l, nullptr, 1.0),
               mirrored::InvalidArgumentError);
}

// The whole model in double: the gradients handed over (last layer first) against finite
// differences of the replica's loss, sampled entries of every parameter.
TEST(FashionCnnModel, GradientsMatchFiniteDifferencesOfTheReplicaLoss) {
  std::mt19937 rng(6);
  std::vector<mirrored::Tensor<double>> params = init_cnn<double>(11);
  // Non-zero biases, so that their gradients are checked away from the initial point too.
  for (int p = 0; p < kNumParams; ++p)
    if (!is_kernel(p))
      for (int64_t i = 0; i < params[p].numel(); ++i) params[p].data()[i] = 0.05 * std::sin(double(i + p));
  const int64_t batch = 3;
  auto x = mirrored::Tensor<double>::from_vector(random_vec(rng, batch * 28 * 28, 0, 1), {batch, 28, 28, 1});
  const auto y = mirrored::Tensor<int32_t>::from_vector({7, 0, 3}, {batch});
  const LossScale scale{/*global_batch=*/5, /*num_replicas=*/2, /*l2=*/0.01};
  CnnWorkspace<double> ws;
  std::vector<mirrored::Tensor<double>> grads(kNumParams);
  std::vector<int> order;
  const CnnStep<double> step =
      cnn_loss_and_grads<double>(params, x, y, scale, ws, [&](int p, mirrored::Tensor<double> g) {
        order.push_back(p);
        grads[p] = std::move(g);
      });
  EXPECT_THAT(order, ::testing::ElementsAre(kDense2Kernel, kDense2Bias, kDense1Kernel, kDense1Bias, kConv2Kernel,
                                            kConv2Bias, kConv1Kernel, kConv1Bias));
  auto loss = [&] {
    return cnn_loss_and_grads<double>(params, x, y, scale, ws, [](int, mirrored::Tensor<double>) {}).loss;
  };
  EXPECT_EQ(loss(), step.loss);
  // The loss is the cross-entropy's sum / 5 plus 0.01 * sum(w^2) / 2 over the kernels.
  const CnnEval eval = cnn_evaluate<double>(params, x, y, ws);
  double reg = 0;
  for (int p = 0; p < kNumParams; ++p)
    if (is_kernel(p))
      for (int64_t i = 0; i < params[p].numel(); ++i) reg += params[p].data()[i] * params[p].data()[i];
  EXPECT_NEAR(step.loss, eval.loss_sum / 5 + 0.01 * reg / 2, 1e-12);
  EXPECT_EQ(step.correct, eval.correct);
  const auto names = param_names();
  for (int p = 0; p < kNumParams; ++p) {
    double* w = params[p].data();
    std::uniform_int_distribution<int64_t> pick(0, params[p].numel() - 1);
    for (int t = 0; t < 6; ++t) {
      const int64_t i = pick(rng);
      const double fd = central_difference(w[i], loss);
      EXPECT_NEAR(grads[p].data()[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << names[p] << "[" << i << "]";
    }
  }
}

TEST(FashionCnnModel, AnEmptyBatchGivesTheRegularisationAlone) {
  std::vector<mirrored::Tensor<double>> params = init_cnn<double>(3);
  const auto x = mirrored::Tensor<double>::zeros({0, 28, 28, 1});
  const auto y = mirrored::Tensor<int32_t>::zeros({0});
  CnnWorkspace<double> ws;
  const LossScale scale{8, 4, 1e-5};
  std::vector<mirrored::Tensor<double>> grads(kNumParams);
  const auto step = cnn_loss_and_grads<double>(params, x, y, scale, ws,
                                               [&](int p, mirrored::Tensor<double> g) { grads[p] = std::move(g); });
  double reg = 0;
  for (int p = 0; p < kNumParams; ++p) {
    for (int64_t i = 0; i < params[p].numel(); ++i) {
      const double w = params[p].data()[i];
      if (is_kernel(p)) reg += w * w;
      EXPECT_EQ(grads[p].data()[i], is_kernel(p) ? 2 * 1e-5 / 4 * w : 0.0) << param_names()[p] << "[" << i << "]";
    }
  }
  EXPECT_NEAR(step.loss, 1e-5 * reg / 4, 1e-12 * (1e-5 * reg / 4));  // summed in another order
  EXPECT_EQ(step.correct, 0);
}

TEST(FashionCnnModel, InitialisationIsKerasGlorotUniformAndZeroBiases) {
  const auto params = init_cnn<float>(0);
  const auto shapes = param_shapes();
  ASSERT_EQ(params.size(), shapes.size());
  // limit = sqrt(6 / (fan_in + fan_out)); a convolution's fans include its 3x3 receptive field.
  const double limits[] = {std::sqrt(6.0 / (9 + 9 * 32)), 0, std::sqrt(6.0 / (9 * 32 + 9 * 64)), 0,
                           std::sqrt(6.0 / (1600 + 64)),  0, std::sqrt(6.0 / (64 + 10)),         0};
  for (int p = 0; p < kNumParams; ++p) {
    EXPECT_EQ(params[p].shape(), shapes[p]);
    double max = 0;
    for (float v : params[p].to_vector()) max = std::max(max, std::abs(double(v)));
    EXPECT_LE(max, limits[p]) << param_names()[p];
    if (is_kernel(p)) {
      EXPECT_GT(max, 0.9 * limits[p]) << param_names()[p];
    }
  }
  // The same seed gives the same weights; another seed others.
  EXPECT_EQ(init_cnn<float>(0)[kConv2Kernel].to_vector(), params[kConv2Kernel].to_vector());
  EXPECT_NE(init_cnn<float>(1)[kConv2Kernel].to_vector(), params[kConv2Kernel].to_vector());
}

TEST(FashionCnnModel, BadShapesAndLabelsAreNamed) {
  auto params = init_cnn<float>(0);
  CnnWorkspace<float> ws;
  const auto x = mirrored::Tensor<float>::zeros({2, 28, 28, 1});
  const auto y = mirrored::Tensor<int32_t>::from_vector({1, 10}, {2});
  auto none = [](int, mirrored::Tensor<float>) {};
  try {
    cnn_loss_and_grads<float>(params, x, y, LossScale{}, ws, none);
    FAIL() << "label 10 accepted";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("label 10 of example 1 is outside 0..9"));
  }
  try {
    cnn_evaluate<float>(params, mirrored::Tensor<float>::zeros({2, 28, 28}), y, ws);
    FAIL() << "rank-3 images accepted";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("images have shape (2, 28, 28), expected (batch, 28, 28, 1)"));
  }
  params[kDense1Kernel] = mirrored::Tensor<float>::zeros({1600, 32});
  try {
    cnn_logits<float>(params, x, ws);
    FAIL() << "a wrong kernel shape accepted";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("parameter dense/kernel has shape (1600, 32), expected (1600, 64)"));
  }
}

}  // namespace
}  // namespace fashion
