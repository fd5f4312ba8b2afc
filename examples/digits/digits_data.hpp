#pragma once
/// \file
/// The digits data set (`data/digits.csv.gz`, see data/README.md): a header-only loader that reads
/// the gzip-compressed CSV with zlib, and a deterministic held-out split.
///
/// Each CSV row is 64 integer pixel values in 0..16 (an 8x8 image, row-major) and the label 0..9.
/// Features are returned as float32 scaled to [0, 1] (pixel / 16, exact), labels as int32.
///
/// Needs zlib at link time (`-lz`, CMake's `ZLIB::ZLIB`).

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <mirrored/errors.hpp>
#include <mirrored/tensor.hpp>

#include "common/gzip.hpp"

namespace digits {

/// Pixels per image (8x8).
inline constexpr int64_t kFeatures = 64;
/// Classes (digits 0..9).
inline constexpr int64_t kClasses = 10;
/// Largest pixel value in the CSV.
inline constexpr int kMaxPixel = 16;

/// Examples of the data set (or of a part of it).
struct Dataset {
  /// `(n, 64)` float32, pixel / 16 in [0, 1].
  mirrored::Tensor<float> features = mirrored::Tensor<float>::zeros({0, kFeatures});
  /// `(n,)` int32 labels in 0..9.
  mirrored::Tensor<int32_t> labels = mirrored::Tensor<int32_t>::zeros({0});

  int64_t size() const { return labels.numel(); }
};

using examples::concat;
using examples::read_gzip_file;

/// Parses the CSV text (already decompressed). `source` names the file in error messages.
/// Blank lines are skipped; `\r\n` line ends are accepted.
/// \throws mirrored::InvalidArgumentError "<source>:<line>: ..." for a bad row (wrong number of
/// fields, a field that is not an integer, a pixel outside 0..16, a label outside 0..9), or when
/// there are no rows.
inline Dataset parse_digits_csv(std::string_view text, const std::string& source) {
  std::vector<float> features;
  std::vector<int32_t> labels;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line

    auto fail = [&](auto&&... parts) {
      throw mirrored::InvalidArgumentError(concat(source, ":", line_no, ": ", parts...));
    };
    int64_t field = 0;
    std::size_t start = 0;
    int values[kFeatures + 1];
    for (;;) {
      std::size_t comma = line.find(',', start);
      const bool last = comma == std::string_view::npos;
      if (last) comma = line.size();
      std::string_view f = line.substr(start, comma - start);
      while (!f.empty() && (f.front() == ' ' || f.front() == '\t')) f.remove_prefix(1);
      while (!f.empty() && (f.back() == ' ' || f.back() == '\t')) f.remove_suffix(1);
      if (field <= kFeatures) {
        int v = 0;
        const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
        if (f.empty() || ec != std::errc() || end != f.data() + f.size())
          fail("field ", field + 1, " ('", f, "') is not an integer");
        values[field] = v;
      }
      ++field;
      if (last) break;
      start = comma + 1;
    }
    if (field != kFeatures + 1)
      fail("expected ", kFeatures + 1, " comma-separated fields (64 pixels and a label), found ", field);
    for (int64_t i = 0; i < kFeatures; ++i) {
      if (values[i] < 0 || values[i] > kMaxPixel) fail("pixel ", i + 1, " is ", values[i], ", outside 0..", kMaxPixel);
      features.push_back(static_cast<float>(values[i]) / static_cast<float>(kMaxPixel));
    }
    const int label = values[kFeatures];
    if (label < 0 || label >= kClasses) fail("label ", label, " is outside 0..", kClasses - 1);
    labels.push_back(label);
  }
  MIRRORED_ENFORCE(!labels.empty(), mirrored::InvalidArgumentError, source, ": no rows");
  const auto n = static_cast<int64_t>(labels.size());
  return Dataset{mirrored::Tensor<float>::from_vector(std::move(features), {n, kFeatures}),
                 mirrored::Tensor<int32_t>::from_vector(std::move(labels), {n})};
}

/// Loads the digits CSV (gzip-compressed) at `path`.
/// \throws what `read_gzip_file` and `parse_digits_csv` throw.
inline Dataset load_digits(const std::string& path) { return parse_digits_csv(read_gzip_file(path), path); }

/// Where the shipped copy is: the build may define `MIRRORED_DIGITS_CSV` (an absolute path);
/// otherwise `data/digits.csv.gz`, relative to the working directory.
inline std::string default_digits_path() {
#ifdef MIRRORED_DIGITS_CSV
  return MIRRORED_DIGITS_CSV;
#else
  return "data/digits.csv.gz";
#endif
}

/// A uniformly random permutation of 0..n-1, the same on every platform for the same seed
/// (`std::mt19937_64` is fully specified; the standard distributions are not, so they are not used:
/// Fisher-Yates with `draw % (i + 1)`, whose bias is below 2^-50 for n < 2^14).
inline std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

/// The examples at `rows` (in that order).
/// \throws mirrored::OutOfRangeError for a row outside the data set.
inline Dataset take_rows(const Dataset& data, const std::vector<int64_t>& rows) {
  MIRRORED_ENFORCE(data.features.device().is_host() && data.labels.device().is_host(), mirrored::InvalidArgumentError,
                   "digits::take_rows: the data set must be in host memory");
  const float* x = data.features.data();
  const int32_t* y = data.labels.data();
  std::vector<float> fx;
  std::vector<int32_t> fy;
  fx.reserve(rows.size() * kFeatures);
  fy.reserve(rows.size());
  for (int64_t r : rows) {
    MIRRORED_ENFORCE(r >= 0 && r < data.size(), mirrored::OutOfRangeError, "digits::take_rows: row ", r,
                     " is outside 0..", data.size() - 1);
    fx.insert(fx.end(), x + r * kFeatures, x + (r + 1) * kFeatures);
    fy.push_back(y[r]);
  }
  const auto n = static_cast<int64_t>(rows.size());
  return Dataset{mirrored::Tensor<float>::from_vector(std::move(fx), {n, kFeatures}),
                 mirrored::Tensor<int32_t>::from_vector(std::move(fy), {n})};
}

/// A training set and a held-out set.
struct Split {
  Dataset train;
  Dataset test;
  /// Rows of the original data set in `train` and in `test` (ascending).
  std::vector<int64_t> train_rows;
  std::vector<int64_t> test_rows;
};

/// Splits `data` into train and held-out parts, deterministically for a `seed`, stratified by
/// class: from each class, round(test_fraction * count) examples (chosen by `permutation`) go to
/// the held-out set. Both parts keep the examples in their original order (shuffle the training
/// set per epoch yourself, e.g. with `permutation`).
/// \throws mirrored::InvalidArgumentError unless 0 <= test_fraction <= 1.
inline Split split_digits(const Dataset& data, double test_fraction, uint64_t seed) {
  MIRRORED_ENFORCE(test_fraction >= 0.0 && test_fraction <= 1.0, mirrored::InvalidArgumentError,
                   "digits::split_digits: test_fraction ", test_fraction, " is outside [0, 1]");
  const std::vector<int32_t> y = data.labels.to_vector();
  std::vector<std::vector<int64_t>> by_class(kClasses);
  for (int64_t i = 0; i < data.size(); ++i) by_class[static_cast<std::size_t>(y[i])].push_back(i);
  std::vector<char> held_out(static_cast<std::size_t>(data.size()), 0);
  for (int64_t c = 0; c < kClasses; ++c) {
    const auto& rows = by_class[static_cast<std::size_t>(c)];
    const auto count = static_cast<int64_t>(rows.size());
    // round-half-up with integer arithmetic on a double product (exact for these sizes)
    const auto k = static_cast<int64_t>(test_fraction * static_cast<double>(count) + 0.5);
    const std::vector<int64_t> order = permutation(count, seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(c));
    for (int64_t i = 0; i < k && i < count; ++i) held_out[static_cast<std::size_t>(rows[order[i]])] = 1;
  }
  std::vector<int64_t> train_rows, test_rows;
  for (int64_t i = 0; i < data.size(); ++i) (held_out[i] ? test_rows : train_rows).push_back(i);
  Split out{take_rows(data, train_rows), take_rows(data, test_rows), {}, {}};
  out.train_rows = std::move(train_rows);
  out.test_rows = std::move(test_rows);
  return out;
}

}  // namespace digits
