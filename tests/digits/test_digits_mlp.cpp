// Unit tests for the digits example's pieces (examples/digits/): the gzip CSV loader on the real
// data/digits.csv.gz, its errors, the held-out split, and the 64-64-10 MLP: initialisation, the
// loss, gradients against finite differences, batch additivity of the summed gradients, and a short
// single-process SGD run that must learn the data set.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "digits/digits_data.hpp"
#include "digits/mlp.hpp"
#include "gtest_util.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace {

namespace fs = std::filesystem;
using mirrored::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string digits_csv() {
#ifdef MIRRORED_DIGITS_CSV
  return MIRRORED_DIGITS_CSV;
#else
  return (fs::path(__FILE__).parent_path().parent_path() / "data" / "digits.csv.gz").string();
#endif
}

const digits::Dataset& real_digits() {
  static const digits::Dataset data = digits::load_digits(digits_csv());
  return data;
}

using mirrored::testing::error_of;

class DigitsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "mirrored_digits_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write_gz(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    gzFile f = gzopen(p.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
    EXPECT_EQ(gzclose(f), Z_OK);
    return p;
  }
  std::string dir_;
};

std::string row(const std::string& pixels_override = "", const std::string& label = "3") {
  std::string r;
  for (int i = 0; i < 64; ++i)
    r += (i == 0 && !pixels_override.empty() ? pixels_override : std::to_string(i % 17)) + ",";
  return r + label;
}

// ---------------------------------------------------------------------------------------------
// Loader
// ---------------------------------------------------------------------------------------------

TEST(DigitsData, RealFileHas1797RowsWithTheKnownClassCounts) {
  const auto& d = real_digits();
  ASSERT_EQ(d.size(), 1797);
  EXPECT_EQ(d.features.shape(), mirrored::Shape({1797, 64}));
  EXPECT_EQ(d.labels.shape(), mirrored::Shape({1797}));
  EXPECT_EQ(d.features.dtype(), mirrored::DType::float32);
  EXPECT_EQ(d.labels.dtype(), mirrored::DType::int32);

  const std::vector<int32_t> y = d.labels.to_vector();
  std::vector<int> counts(10, 0);
  for (int32_t v : y) {
    ASSERT_GE(v, 0);
    ASSERT_LE(v, 9);
    ++counts[v];
  }
  EXPECT_EQ(counts, (std::vector<int>{178, 182, 177, 183, 181, 182, 181, 179, 174, 180}));
  EXPECT_EQ(std::accumulate(y.begin(), y.end(), int64_t{0}), 8070);

  // Features are pixel / 16, exactly: every value is k/16 for k in 0..16; the pixel sum is known.
  const std::vector<float> x = d.features.to_vector();
  double pixel_sum = 0;
  for (float v : x) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LE(v, 1.0f);
    ASSERT_EQ(v * 16.0f, std::round(v * 16.0f));
    pixel_sum += v * 16.0f;
  }
  EXPECT_EQ(pixel_sum, 561718.0);
  // First row: 0,0,5,13,9,1,0,0,... label 0; last row ends in ...,12,1,0, label 8.
  EXPECT_EQ(x[2], 5.0f / 16.0f);
  EXPECT_EQ(x[3], 13.0f / 16.0f);
  EXPECT_EQ(y.front(), 0);
  EXPECT_EQ(x[1796 * 64 + 2], 10.0f / 16.0f);
  EXPECT_EQ(x[1796 * 64 + 61], 12.0f / 16.0f);
  EXPECT_EQ(x[1796 * 64 + 62], 1.0f / 16.0f);
  EXPECT_EQ(y.back(), 8);
}

TEST(DigitsData, DefaultPathPointsAtTheShippedFile) {
  const std::string p = digits::default_digits_path();
#ifdef MIRRORED_DIGITS_CSV
  EXPECT_TRUE(fs::exists(p)) << p;
#else
  EXPECT_EQ(p, "data/digits.csv.gz");
#endif
}

TEST(DigitsData, ParsesRowsWithCrLfBlankLinesAndSpaces) {
  const std::string text = row() + "\r\n\n   \n" + row(" 16 ", " 9 ") + "\n";
  const auto d = digits::parse_digits_csv(text, "mem.csv");
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(d.labels.to_vector(), (std::vector<int32_t>{3, 9}));
  const auto x = d.features.to_vector();
  EXPECT_EQ(x[1], 1.0f / 16.0f);
  EXPECT_EQ(x[16], 1.0f);  // 16 % 17 = 16 → 1.0
  EXPECT_EQ(x[64], 1.0f);  // " 16 " overrides the first pixel of row 2
}

TEST(DigitsData, BadRowsNameTheFileAndLine) {
  auto msg = [](const std::string& text) {
    return error_of<mirrored::InvalidArgumentError>([&] { digits::parse_digits_csv(text, "bad.csv"); });
  };
  EXPECT_THAT(msg(row() + "\n" + row() + ",4\n"),
              AllOf(HasSubstr("bad.csv:2: "), HasSubstr("expected 65 comma-separated fields"), HasSubstr("found 66")));
  EXPECT_THAT(msg(row() + "\n\n1,2,3\n"), AllOf(HasSubstr("bad.csv:3: "), HasSubstr("found 3")));
  EXPECT_THAT(msg(row("x1")), AllOf(HasSubstr("bad.csv:1: "), HasSubstr("field 1 ('x1') is not an integer")));
  EXPECT_THAT(msg(row("1.5")), HasSubstr("field 1 ('1.5') is not an integer"));
  EXPECT_THAT(msg("," + row().substr(row().find(',') + 1)), HasSubstr("bad.csv:1: field 1 ('') is not an integer"));
  EXPECT_THAT(msg(row("17")), HasSubstr("bad.csv:1: pixel 1 is 17, outside 0..16"));
  EXPECT_THAT(msg(row("-1")), HasSubstr("pixel 1 is -1"));
  EXPECT_THAT(msg(row("", "10")), HasSubstr("bad.csv:1: label 10 is outside 0..9"));
  EXPECT_THAT(msg(row("", "")), HasSubstr("field 65 ('') is not an integer"));
  EXPECT_THAT(msg("\n \n"), HasSubstr("bad.csv: no rows"));
}

TEST_F(DigitsFiles, GzipFilesAreReadWithZlib) {
  const std::string good = write_gz("good.csv.gz", row() + "\n" + row("0", "7") + "\n");
  const auto d = digits::load_digits(good);
  EXPECT_EQ(d.labels.to_vector(), (std::vector<int32_t>{3, 7}));

  const std::string bad = write_gz("bad.csv.gz", row() + "\n" + row() + "\n" + row("99") + "\n");
  EXPECT_THAT(error_of<mirrored::InvalidArgumentError>([&] { digits::load_digits(bad); }),
              HasSubstr(bad + ":3: pixel 1 is 99"));

  const std::string missing = dir_ + "/missing.csv.gz";
  EXPECT_THAT(error_of<mirrored::NotFoundError>([&] { digits::load_digits(missing); }), HasSubstr(missing));

  // A truncated gzip stream is an error, not a silently shorter data set.
  std::ifstream in(digits_csv(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string cut = dir_ + "/cut.csv.gz";
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  EXPECT_THAT(error_of<mirrored::InvalidArgumentError>([&] { digits::load_digits(cut); }),
              AllOf(HasSubstr(cut), HasSubstr("corrupt or truncated gzip")));
}

// ---------------------------------------------------------------------------------------------
// Permutation and split
// ---------------------------------------------------------------------------------------------

TEST(DigitsData, PermutationIsDeterministicAndComplete) {
  const auto p = digits::permutation(1000, 7);
  EXPECT_EQ(p, digits::permutation(1000, 7));
  EXPECT_NE(p, digits::permutation(1000, 8));
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_EQ(digits::permutation(0, 1), std::vector<int64_t>{});
  EXPECT_EQ(digits::permutation(1, 1), std::vector<int64_t>{0});
}

TEST(DigitsData, SplitIsStratifiedDisjointAndDeterministic) {
  const auto& d = real_digits();
  const auto s = digits::split_digits(d, 0.2, 42);
  // Per class round(0.2 * count): 36+36+35+37+36+36+36+36+35+36.
  EXPECT_EQ(s.test.size(), 359);
  EXPECT_EQ(s.train.size(), 1797 - 359);
  EXPECT_EQ(s.test_rows.size(), 359u);
  EXPECT_EQ(s.train.features.shape(), mirrored::Shape({1438, 64}));

  std::set<int64_t> all(s.train_rows.begin(), s.train_rows.end());
  all.insert(s.test_rows.begin(), s.test_rows.end());
  EXPECT_EQ(all.size(), 1797u);  // disjoint and complete
  EXPECT_TRUE(std::is_sorted(s.train_rows.begin(), s.train_rows.end()));

  // The split rows carry the original examples.
  const auto x = d.features.to_vector();
  const auto tx = s.test.features.to_vector();
  const auto y = d.labels.to_vector();
  const auto ty = s.test.labels.to_vector();
  for (std::size_t i = 0; i < s.test_rows.size(); ++i) {
    const auto r = static_cast<std::size_t>(s.test_rows[i]);
    ASSERT_EQ(ty[i], y[r]);
    ASSERT_TRUE(std::equal(tx.begin() + i * 64, tx.begin() + (i + 1) * 64, x.begin() + r * 64));
  }
  std::vector<int> counts(10, 0);
  for (int32_t v : ty) ++counts[v];
  EXPECT_EQ(counts, (std::vector<int>{36, 36, 35, 37, 36, 36, 36, 36, 35, 36}));

  EXPECT_EQ(digits::split_digits(d, 0.2, 42).test_rows, s.test_rows);
  EXPECT_NE(digits::split_digits(d, 0.2, 43).test_rows, s.test_rows);
  EXPECT_EQ(digits::split_digits(d, 0.0, 1).test.size(), 0);
  EXPECT_EQ(digits::split_digits(d, 1.0, 1).train.size(), 0);
  EXPECT_THROW(digits::split_digits(d, 1.5, 1), mirrored::InvalidArgumentError);
}

// ---------------------------------------------------------------------------------------------
// MLP
// ---------------------------------------------------------------------------------------------

TEST(DigitsMlp, GlorotInitIsDeterministicAndBounded) {
  const auto p = digits::init_mlp(42);
  EXPECT_EQ(p.w1.shape(), mirrored::Shape({64, 64}));
  EXPECT_EQ(p.b1.shape(), mirrored::Shape({64}));
  EXPECT_EQ(p.w2.shape(), mirrored::Shape({64, 10}));
  EXPECT_EQ(p.b2.shape(), mirrored::Shape({10}));
  const auto q = digits::init_mlp(42);
  EXPECT_EQ(p.w1.to_vector(), q.w1.to_vector());
  EXPECT_EQ(p.w2.to_vector(), q.w2.to_vector());
  EXPECT_NE(p.w1.to_vector(), digits::init_mlp(43).w1.to_vector());
  EXPECT_EQ(p.b1.to_vector(), std::vector<float>(64, 0.0f));
  EXPECT_EQ(p.b2.to_vector(), std::vector<float>(10, 0.0f));

  const double limit1 = std::sqrt(6.0 / 128.0), limit2 = std::sqrt(6.0 / 74.0);
  double mean = 0, max_abs = 0;
  for (float v : p.w1.to_vector()) {
    mean += v;
    max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
  }
  mean /= 4096;
  EXPECT_LT(max_abs, limit1);
  EXPECT_GT(max_abs, 0.95 * limit1);
  EXPECT_LT(std::abs(mean), 0.02);
  for (float v : p.w2.to_vector()) EXPECT_LT(std::abs(v), limit2);

  // The float parameters are the double ones rounded (one draw sequence for both types).
  const auto pd = digits::init_mlp<double>(42);
  const auto w1d = pd.w1.to_vector();
  const auto w1f = p.w1.to_vector();
  for (std::size_t i = 0; i < w1d.size(); ++i) ASSERT_EQ(w1f[i], static_cast<float>(w1d[i]));
}

TEST(DigitsMlp, ZeroParametersGiveLog10LossAndExactGradients) {
  auto p = digits::MlpParams::zeros();
  const auto x = Tensor<float>::full({4, 64}, 0.5f);
  const auto y = Tensor<int32_t>::from_vector({3, 3, 0, 9}, {4});
  const auto step = digits::mlp_loss_and_grads(p, x, y);
  for (float l : step.per_example_loss.to_vector()) EXPECT_FLOAT_EQ(l, std::log(10.0f));
  // d loss_i / d logits_i = 0.1 - onehot(y_i); summed over the batch for b2.
  const std::vector<float> want_b2 = {0.4f - 1, 0.4f, 0.4f, 0.4f - 2, 0.4f, 0.4f, 0.4f, 0.4f, 0.4f, 0.4f - 1};
  const auto b2 = step.grads.b2.to_vector();
  for (int k = 0; k < 10; ++k) EXPECT_FLOAT_EQ(b2[k], want_b2[k]) << k;
  // The hidden layer is relu(0) = 0 and w2 = 0, so nothing else gets a gradient.
  for (const auto& g : {step.grads.w1, step.grads.b1, step.grads.w2})
    for (float v : g.to_vector()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(step.correct, 1);  // all logits tie: argmax is class 0, right for one example
  EXPECT_EQ(digits::mlp_correct(p, x, y), 1);
  EXPECT_DOUBLE_EQ(digits::mlp_accuracy(p, x, y), 0.25);
}

/// Double-precision parameters with nonzero biases, and a batch of real examples.
struct GradCase {
  digits::MlpParamsT<double> params = digits::init_mlp<double>(5);
  Tensor<double> x;
  Tensor<int32_t> y;
  GradCase() {
    std::vector<double> b1(64), b2(10);
    for (int i = 0; i < 64; ++i) b1[i] = 0.05 * std::sin(i + 1.0);
    for (int i = 0; i < 10; ++i) b2[i] = 0.1 * std::cos(i + 1.0);
    params.b1 = Tensor<double>::from_vector(b1, {64});
    params.b2 = Tensor<double>::from_vector(b2, {10});
    const auto part = digits::take_rows(real_digits(), {0, 1, 2, 3, 5, 8, 13, 21});
    x = mirrored::cast<double>(part.features);
    y = part.labels;
  }
  double total_loss(const digits::MlpParamsT<double>& p) const {
    double s = 0;
    for (double l : digits::mlp_loss_and_grads(p, x, y).per_example_loss.to_vector()) s += l;
    return s;
  }
};

TEST(DigitsMlp, GradientsMatchFiniteDifferences) {
  const GradCase c;
  const auto step = digits::mlp_loss_and_grads(c.params, c.x, c.y);
  const auto names = digits::MlpParamsT<double>::names();
  const auto grads = step.grads.tensors();
  const double eps = 1e-6;
  int checked = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    const auto analytic = grads[k].to_vector();
    const int64_t n = static_cast<int64_t>(analytic.size());
    const int64_t stride = n > 100 ? 17 : 1;  // every 17th weight of the kernels, every bias
    for (int64_t i = 0; i < n; i += stride) {
      auto perturbed = [&](double delta) {
        digits::MlpParamsT<double> p = c.params;
        std::vector<mirrored::Tensor<double>*> ts = {&p.w1, &p.b1, &p.w2, &p.b2};
        auto v = ts[k]->to_vector();
        v[i] += delta;
        *ts[k] = Tensor<double>::from_vector(v, ts[k]->shape());
        return c.total_loss(p);
      };
      const double numeric = (perturbed(eps) - perturbed(-eps)) / (2 * eps);
      ASSERT_NEAR(analytic[i], numeric, 1e-6 + 1e-6 * std::abs(numeric)) << names[k] << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 241 + 64 + 38 + 10);
  // Not a vacuous check: the gradients are far from zero.
  double norm = 0;
  for (const auto& g : grads)
    for (double v : g.to_vector()) norm += v * v;
  EXPECT_GT(norm, 1e-2);
}

TEST(DigitsMlp, FloatMatchesDoubleAndPerExampleLossesAreFinite) {
  const GradCase c;
  const digits::MlpParams pf{mirrored::cast<float>(c.params.w1), mirrored::cast<float>(c.params.b1),
                             mirrored::cast<float>(c.params.w2), mirrored::cast<float>(c.params.b2)};
  const auto sd = digits::mlp_loss_and_grads(c.params, c.x, c.y);
  const auto sf = digits::mlp_loss_and_grads(pf, mirrored::cast<float>(c.x), c.y);
  const auto ld = sd.per_example_loss.to_vector();
  const auto lf = sf.per_example_loss.to_vector();
  ASSERT_EQ(lf.size(), 8u);
  for (std::size_t i = 0; i < ld.size(); ++i) {
    EXPECT_TRUE(std::isfinite(lf[i]));
    EXPECT_GT(lf[i], 0.0f);
    EXPECT_NEAR(lf[i], ld[i], 1e-5 * (1 + ld[i]));
  }
  const auto gd = sd.grads.tensors();
  const auto gf = sf.grads.tensors();
  for (std::size_t k = 0; k < 4; ++k) {
    const auto a = gd[k].to_vector();
    const auto b = gf[k].to_vector();
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 1e-4 * (1 + std::abs(a[i])));
  }
  EXPECT_EQ(sf.correct, sd.correct);
}

TEST(DigitsMlp, GradientsAreSumsSoBatchesAddUp) {
  // The gradient of a batch is the sum of the gradients of its parts (what a SUM all-reduce of
  // per-replica gradients relies on), and the per-example losses are the parts' concatenated.
  const auto p = digits::init_mlp(3);
  const auto& d = real_digits();
  const auto whole = digits::take_rows(d, {10, 11, 12, 13, 14, 15});
  const auto a = digits::take_rows(d, {10, 11, 12, 13});
  const auto b = digits::take_rows(d, {14, 15});
  const auto sw = digits::mlp_loss_and_grads(p, whole.features, whole.labels);
  const auto sa = digits::mlp_loss_and_grads(p, a.features, a.labels);
  const auto sb = digits::mlp_loss_and_grads(p, b.features, b.labels);
  const auto gw = sw.grads.tensors(), ga = sa.grads.tensors(), gb = sb.grads.tensors();
  for (std::size_t k = 0; k < 4; ++k) {
    const auto w = gw[k].to_vector(), x = ga[k].to_vector(), z = gb[k].to_vector();
    for (std::size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], x[i] + z[i], 1e-5f * (1 + std::abs(w[i])));
  }
  auto lw = sw.per_example_loss.to_vector(), la = sa.per_example_loss.to_vector(), lb = sb.per_example_loss.to_vector();
  la.insert(la.end(), lb.begin(), lb.end());
  for (std::size_t i = 0; i < lw.size(); ++i) EXPECT_FLOAT_EQ(lw[i], la[i]);
  EXPECT_EQ(sw.correct, sa.correct + sb.correct);
  // An empty batch contributes nothing.
  const auto se = digits::mlp_loss_and_grads(p, Tensor<float>::zeros({0, 64}), Tensor<int32_t>::zeros({0}));
  EXPECT_EQ(se.per_example_loss.numel(), 0);
  for (float v : se.grads.w1.to_vector()) ASSERT_EQ(v, 0.0f);
}

TEST(DigitsMlp, BadShapesAndLabelsAreRejected) {
  const auto p = digits::init_mlp(1);
  const auto x = Tensor<float>::zeros({2, 64});
  EXPECT_THAT(error_of<mirrored::InvalidArgumentError>([&] {
                digits::mlp_loss_and_grads(p, x, Tensor<int32_t>::from_vector({1, 10}, {2}));
              }),
              HasSubstr("label 10 of example 1 is outside 0..9"));
  EXPECT_THAT(
      error_of<mirrored::InvalidArgumentError>([&] { digits::mlp_loss_and_grads(p, x, Tensor<int32_t>::zeros({3})); }),
      HasSubstr("labels have shape (3,), expected (2,)"));
  EXPECT_THAT(error_of<mirrored::InvalidArgumentError>([&] {
                digits::mlp_logits(p, Tensor<float>::zeros({2, 63}));
              }),
              HasSubstr("features have shape (2, 63)"));
  auto bad = p;
  bad.b2 = Tensor<float>::zeros({9});
  EXPECT_THAT(error_of<mirrored::InvalidArgumentError>([&] { digits::mlp_logits(bad, x); }),
              HasSubstr("dense_1/bias has shape (9,), expected (10,)"));
  EXPECT_EQ(digits::mlp_logits(p, x).shape(), mirrored::Shape({2, 10}));
}

TEST(DigitsMlp, PlainSgdLearnsTheDataSet) {
  // Single-process reference training: mean gradient over batches of 32, SGD with learning rate
  // 0.5, shuffled each epoch. The distributed example must do at least as well.
  const auto split = digits::split_digits(real_digits(), 0.2, 0);
  auto p = digits::init_mlp(0);
  const double initial = digits::mlp_accuracy(p, split.test.features, split.test.labels);
  const int64_t n = split.train.size(), batch = 32;
  const float lr = 0.5f;
  for (int epoch = 0; epoch < 10; ++epoch) {
    const auto order = digits::permutation(n, 1000 + epoch);
    for (int64_t start = 0; start < n; start += batch) {
      const std::vector<int64_t> rows(order.begin() + start, order.begin() + std::min(n, start + batch));
      const auto b = digits::take_rows(split.train, rows);
      const auto step = digits::mlp_loss_and_grads(p, b.features, b.labels);
      const float scale = lr / static_cast<float>(rows.size());
      p.w1 = p.w1 - step.grads.w1 * scale;
      p.b1 = p.b1 - step.grads.b1 * scale;
      p.w2 = p.w2 - step.grads.w2 * scale;
      p.b2 = p.b2 - step.grads.b2 * scale;
    }
  }
  const double acc = digits::mlp_accuracy(p, split.test.features, split.test.labels);
  EXPECT_LT(initial, 0.3);
  EXPECT_GE(acc, 0.95) << "held-out accuracy after 10 epochs";
  double loss = 0;
  for (float l : digits::mlp_loss_and_grads(p, split.train.features, split.train.labels).per_example_loss.to_vector())
    loss += l;
  EXPECT_LT(loss / static_cast<double>(n), 0.2);
}

}  // namespace
