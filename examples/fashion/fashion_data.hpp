#pragma once
/// \file
/// Fashion-MNIST (Zalando; Debian's `dataset-fashion-mnist` installs it in
/// /usr/share/datasets/fashion-mnist/): 60,000 training and 10,000 test images of 28x28 grey
/// pixels, each with a label 0..9, in MNIST's IDX format, each file gzip-compressed
/// (`train-images-idx3-ubyte.gz`) or plain (`train-images-idx3-ubyte`).
///
/// IDX: a big-endian header -- two zero bytes, a type byte (0x08: unsigned bytes, the only type
/// these files use), the number of dimensions -- then each dimension as a big-endian uint32, then
/// the values in row-major order, nothing after them.

#include <cstdint>
#include <string>
#include <vector>

namespace fashion {

/// Image size and classes.
inline constexpr int64_t kImageSide = 28;
inline constexpr int64_t kPixels = kImageSide * kImageSide;
inline constexpr int64_t kClasses = 10;

/// The class names, by label.
inline const char* const kClassNames[kClasses] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

/// An IDX file's unsigned-byte array, or its first items.
struct IdxArray {
  std::vector<int64_t> dims;    ///< the file's
  std::vector<uint8_t> values;  ///< row-major: all of them, or those of the first `max_items` items
};

/// Parses IDX `bytes` (already decompressed; with `max_items` > 0 at least the header and the
/// first `max_items` items along the first dimension, of which `values` then holds only those);
/// `source` names the file in messages. \throws mirrored::InvalidArgumentError "<source>: ..." for
/// a header shorter than its dimensions, a magic number other than 00 00 08 <ndims> with ndims in
/// 1..4 (naming the bytes found), a zero dimension, fewer values than the dimensions (or the
/// items asked for) need (truncated: both counts) or, reading all, bytes after them.
IdxArray parse_idx(const std::string& bytes, const std::string& source, int64_t max_items = 0);

/// Reads and parses the IDX file at `path` (gzip or plain); with `max_items` > 0 only as much of
/// it as the first `max_items` items need (the rest is neither decompressed nor checked).
/// \throws mirrored::NotFoundError when it does not exist; what `examples::read_gzip_file` and
/// `parse_idx` throw.
IdxArray read_idx(const std::string& path, int64_t max_items = 0);

/// One split: images as bytes (0..255), row-major (n, 28, 28), and labels.
struct Split {
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

struct FashionMnist {
  Split train, test;
};

/// The file of `dir` named `name` (`train-images-idx3-ubyte`): `name.gz` if it exists, else `name`.
std::string idx_path(const std::string& dir, const std::string& name);

/// Loads one split from its images file (dims (n, 28, 28)) and labels file (dims (n,), values
/// 0..9), reading only the first `limit` examples (0: all). \throws what `read_idx` throws;
/// mirrored::InvalidArgumentError for other dimensions (naming the file's dims), counts that
/// disagree, a label outside 0..9 (naming its index) or `limit` above the number of examples.
Split load_split(const std::string& images_path, const std::string& labels_path, int64_t limit = 0);

/// Loads the training and test splits from `dir` (`train-images-idx3-ubyte[.gz]`,
/// `train-labels-idx1-ubyte[.gz]`, `t10k-images-idx3-ubyte[.gz]`, `t10k-labels-idx1-ubyte[.gz]`).
/// \throws what `load_split` throws.
FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit = 0, int64_t test_limit = 0);

/// Where Debian's package puts the files, unless the build defines MIRRORED_FASHION_MNIST_DIR.
inline std::string default_fashion_mnist_dir() {
#ifdef MIRRORED_FASHION_MNIST_DIR
  return MIRRORED_FASHION_MNIST_DIR;
#else
  return "/usr/share/datasets/fashion-mnist";
#endif
}

}  // namespace fashion
