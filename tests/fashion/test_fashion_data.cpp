// Fashion-MNIST's IDX files (examples/fashion/fashion_data.hpp): files written here, good and
// damaged, gzip-compressed and plain; and the installed data set where it is.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cluster/process_harness.hpp"
#include "fashion/fashion_data.hpp"

namespace fashion {
namespace {

using ::testing::HasSubstr;

// An IDX header: 00 00 08 <ndims>, then each dimension big-endian.
std::string idx_header(const std::vector<uint32_t>& dims, unsigned char type = 0x08) {
  std::string h = {'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<char>((d >> shift) & 0xff));
  return h;
}

std::string write_file(const std::string& path, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  return path;
}

// n images whose pixel p of image i is (i + p) % 256, and labels i % 10.
std::string images_bytes(uint32_t n) {
  std::string b = idx_header({n, 28, 28});
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t p = 0; p < 784; ++p) b.push_back(static_cast<char>((i + p) % 256));
  return b;
}
std::string labels_bytes(uint32_t n) {
  std::string b = idx_header({n});
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<char>(i % 10));
  return b;
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const mirrored::InvalidArgumentError& e) {
    return e.what();
  }
  return "(no InvalidArgumentError)";
}

TEST(FashionData, ReadsGzipAndPlainFilesAndKeepsAPrefix) {
  mirrored::testing::TempDir dir;
  const std::string d = dir.path();
  write_file(d + "/train-images-idx3-ubyte.gz", images_bytes(5), true);
  write_file(d + "/train-labels-idx1-ubyte.gz", labels_bytes(5), true);
  write_file(d + "/t10k-images-idx3-ubyte", images_bytes(3), false);
  write_file(d + "/t10k-labels-idx1-ubyte", labels_bytes(3), false);
  const FashionMnist all = load_fashion_mnist(d);
  ASSERT_EQ(all.train.size(), 5);
  ASSERT_EQ(all.test.size(), 3);
  EXPECT_EQ(all.train.labels, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(all.train.images.size(), 5u * 784);
  EXPECT_EQ(all.train.images[4 * 784 + 300], (4 + 300) % 256);
  const FashionMnist some = load_fashion_mnist(d, 2, 1);
  EXPECT_EQ(some.train.size(), 2);
  EXPECT_EQ(some.train.images.size(), 2u * 784);
  EXPECT_EQ(some.test.labels, (std::vector<int32_t>{0}));
  EXPECT_THAT(error_of([&] { load_fashion_mnist(d, 6, 0); }), HasSubstr("asked for 6 examples of"));
  // A prefix is all that is read: a file cut after its second image still gives two, not three.
  const std::string cut = write_file(d + "/cut.gz", images_bytes(5).substr(0, 16 + 2 * 784 + 100), true);
  EXPECT_EQ(read_idx(cut, 2).values.size(), 2u * 784);
  EXPECT_EQ(read_idx(cut, 2).dims, (std::vector<int64_t>{5, 28, 28}));
  EXPECT_THAT(
      error_of([&] { read_idx(cut, 3); }),
      HasSubstr("cut.gz: truncated: dimensions (5, 28, 28) need 3920 bytes of data, the file has fewer than 2352"));
  EXPECT_THAT(error_of([&] { read_idx(cut); }),
              HasSubstr("cut.gz: truncated: dimensions (5, 28, 28) need 3920 bytes of data, the file has 1668"));
}

TEST(FashionData, AMissingFileIsNotFound) {
  mirrored::testing::TempDir dir;
  EXPECT_THROW(load_fashion_mnist(dir.path()), mirrored::NotFoundError);
  EXPECT_EQ(idx_path(dir.path(), "x"), (std::filesystem::path(dir.path()) / "x").string());
}

TEST(FashionData, BadFilesNameTheFileAndWhatIsWrong) {
  mirrored::testing::TempDir dir;
  const std::string d = dir.path();
  auto parse = [](const std::string& bytes) { return [bytes] { parse_idx(bytes, "f.idx"); }; };
  EXPECT_THAT(error_of(parse(std::string(2, '\0'))), HasSubstr("f.idx: not an IDX file: 2 bytes"));
  EXPECT_THAT(error_of(parse(idx_header({2}, 0x0d) + "ab")),
              HasSubstr("f.idx: bad IDX magic number 00 00 0d 01, expected 00 00 08"));
  EXPECT_THAT(error_of(parse(std::string("PK\x03\x04", 4))), HasSubstr("bad IDX magic number 50 4b 03 04"));
  EXPECT_THAT(error_of(parse(idx_header({2, 3}).substr(0, 9))),
              HasSubstr("f.idx: truncated IDX header: 9 bytes, 2 dimensions need 12"));
  EXPECT_THAT(error_of(parse(idx_header({2, 0}))), HasSubstr("f.idx: IDX dimension 1 is 0"));
  EXPECT_THAT(error_of(parse(idx_header({2, 3}) + "abcd")),
              HasSubstr("f.idx: truncated: dimensions (2, 3) need 6 bytes of data, the file has 4"));
  EXPECT_THAT(error_of(parse(idx_header({2}) + "abc")), HasSubstr("f.idx: 1 bytes after the data of dimensions (2,)"));

  // A truncated gzip stream (the file cut in the middle).
  const std::string images = write_file(d + "/images.gz", images_bytes(4), true);
  const std::string labels = write_file(d + "/labels", labels_bytes(4), false);
  std::filesystem::resize_file(images, std::filesystem::file_size(images) / 2);
  EXPECT_THAT(error_of([&] { read_idx(images); }), HasSubstr("images.gz"));

  // Wrong dimensions, disagreeing counts, a bad label.
  write_file(images, idx_header({4, 28, 27}) + std::string(4 * 28 * 27, '\0'), true);
  EXPECT_THAT(error_of([&] { load_split(images, labels); }),
              HasSubstr("images.gz: images have dimensions (4, 28, 27), expected (n, 28, 28)"));
  write_file(images, images_bytes(3), true);
  EXPECT_THAT(error_of([&] { load_split(images, labels); }), HasSubstr("images.gz has 3 images but"));
  write_file(images, images_bytes(4), true);
  write_file(labels, idx_header({4}) + std::string("\x01\x02\x0a\x03", 4), false);
  EXPECT_THAT(error_of([&] { load_split(images, labels); }),
              HasSubstr("labels: label 10 of example 2 is outside 0..9"));
  write_file(labels, idx_header({4, 1}) + std::string(4, '\0'), false);
  EXPECT_THAT(error_of([&] { load_split(images, labels); }),
              HasSubstr("labels: labels have dimensions (4, 1), expected (n,)"));
}

TEST(FashionData, TheInstalledDataSet) {
  const std::string dir = default_fashion_mnist_dir();
  if (!std::filesystem::exists(idx_path(dir, "train-labels-idx1-ubyte")))
    GTEST_SKIP() << "Fashion-MNIST is not in " << dir << " (Debian's dataset-fashion-mnist; scripts/install-deps.sh)";
  const FashionMnist data = load_fashion_mnist(dir);
  ASSERT_EQ(data.train.size(), 60000);
  ASSERT_EQ(data.test.size(), 10000);
  EXPECT_THAT(std::vector<int32_t>(data.train.labels.begin(), data.train.labels.begin() + 10),
              ::testing::ElementsAre(9, 0, 0, 3, 0, 2, 7, 2, 5, 5));
  EXPECT_THAT(std::vector<int32_t>(data.test.labels.begin(), data.test.labels.begin() + 10),
              ::testing::ElementsAre(9, 2, 1, 1, 6, 1, 4, 6, 5, 7));
  // Every class 6,000 times in training, 1,000 in test.
  std::vector<int> train_counts(10), test_counts(10);
  for (int32_t l : data.train.labels) ++train_counts[l];
  for (int32_t l : data.test.labels) ++test_counts[l];
  EXPECT_THAT(train_counts, ::testing::Each(6000));
  EXPECT_THAT(test_counts, ::testing::Each(1000));
  long sum = 0;
  for (int p = 0; p < 784; ++p) sum += data.train.images[p];
  EXPECT_EQ(sum, 76247);  // the first image's pixel sum
}

}  // namespace
}  // namespace fashion
