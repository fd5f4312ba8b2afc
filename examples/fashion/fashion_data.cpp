// Fashion-MNIST's IDX files (fashion_data.hpp).
#include "fashion/fashion_data.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <mirrored/errors.hpp>

#include "common/gzip.hpp"

namespace fashion {
namespace {

using examples::concat;

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + (dims.size() == 1 ? ",)" : ")");
}

std::string hex_bytes(const std::string& bytes, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n && i < bytes.size(); ++i) {
    char b[4];
    std::snprintf(b, sizeof b, "%s%02x", i ? " " : "", static_cast<unsigned char>(bytes[i]));
    out += b;
  }
  return out;
}

// The dimensions of an IDX header (the magic number and one big-endian uint32 per dimension).
std::vector<int64_t> parse_idx_header(const std::string& bytes, const std::string& source) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  MIRRORED_ENFORCE(bytes.size() >= 4, mirrored::InvalidArgumentError, source, ": not an IDX file: ", bytes.size(),
                   " bytes, shorter than the 4-byte magic number");
  const int ndims = byte(3);
  MIRRORED_ENFORCE(byte(0) == 0 && byte(1) == 0 && byte(2) == 0x08 && ndims >= 1 && ndims <= 4,
                   mirrored::InvalidArgumentError, source, ": bad IDX magic number ", hex_bytes(bytes, 4),
                   ", expected 00 00 08 <dimensions 1..4> (unsigned bytes)");
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndims);
  MIRRORED_ENFORCE(bytes.size() >= header, mirrored::InvalidArgumentError, source,
                   ": truncated IDX header: ", bytes.size(), " bytes, ", ndims, " dimensions need ", header);
  std::vector<int64_t> dims;
  uint64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    const std::size_t at = 4 + 4 * static_cast<std::size_t>(d);
    const uint64_t dim = (uint64_t{byte(at)} << 24) | (uint64_t{byte(at + 1)} << 16) | (uint64_t{byte(at + 2)} << 8) |
                         uint64_t{byte(at + 3)};
    MIRRORED_ENFORCE(dim > 0, mirrored::InvalidArgumentError, source, ": IDX dimension ", d, " is 0");
    dims.push_back(static_cast<int64_t>(dim));
    count *= dim;
    MIRRORED_ENFORCE(count <= (uint64_t{1} << 40), mirrored::InvalidArgumentError, source,
                     ": IDX dimensions too large: ", dims_string(dims));
  }
  return dims;
}

}  // namespace

IdxArray parse_idx(const std::string& bytes, const std::string& source, int64_t max_items) {
  IdxArray out;
  out.dims = parse_idx_header(bytes, source);
  const std::size_t header = 4 + 4 * out.dims.size();
  uint64_t count = 1;
  for (int64_t d : out.dims) count *= static_cast<uint64_t>(d);
  const uint64_t have = bytes.size() - header;
  const uint64_t items = static_cast<uint64_t>(out.dims[0]);
  const uint64_t wanted = max_items > 0 ? count / items * std::min(items, static_cast<uint64_t>(max_items)) : count;
  MIRRORED_ENFORCE(have >= wanted, mirrored::InvalidArgumentError, source, ": truncated: dimensions ",
                   dims_string(out.dims), " need ", count, " bytes of data, the file has ",
                   max_items > 0 ? "fewer than " : "", max_items > 0 ? wanted : have);
  MIRRORED_ENFORCE(max_items > 0 || have == count, mirrored::InvalidArgumentError, source, ": ", have - count,
                   " bytes after the data of dimensions ", dims_string(out.dims));
  const auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(header);
  out.values.assign(begin, begin + static_cast<std::ptrdiff_t>(wanted));
  return out;
}

IdxArray read_idx(const std::string& path, int64_t max_items) {
  if (max_items <= 0) return parse_idx(examples::read_gzip_file(path), path);
  // The header first (at most 4 dimensions), for the size of the items asked for.
  const std::string head = examples::read_gzip_file(path, 4 + 4 * 4);
  const std::vector<int64_t> dims = parse_idx_header(head, path);
  uint64_t item = 1;
  for (std::size_t d = 1; d < dims.size(); ++d) item *= static_cast<uint64_t>(dims[d]);
  const std::size_t bytes = 4 + 4 * dims.size() + item * static_cast<uint64_t>(max_items);
  return parse_idx(examples::read_gzip_file(path, bytes), path, max_items);
}

std::string idx_path(const std::string& dir, const std::string& name) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  std::error_code ec;
  const std::filesystem::path gz = base.string() + ".gz";
  return std::filesystem::exists(gz, ec) ? gz.string() : base.string();
}

Split load_split(const std::string& images_path, const std::string& labels_path, int64_t limit) {
  IdxArray images = read_idx(images_path, limit);
  IdxArray labels = read_idx(labels_path, limit);
  MIRRORED_ENFORCE(images.dims.size() == 3 && images.dims[1] == kImageSide && images.dims[2] == kImageSide,
                   mirrored::InvalidArgumentError, images_path, ": images have dimensions ", dims_string(images.dims),
                   ", expected (n, ", kImageSide, ", ", kImageSide, ")");
  MIRRORED_ENFORCE(labels.dims.size() == 1, mirrored::InvalidArgumentError, labels_path, ": labels have dimensions ",
                   dims_string(labels.dims), ", expected (n,)");
  MIRRORED_ENFORCE(labels.dims[0] == images.dims[0], mirrored::InvalidArgumentError, images_path, " has ",
                   images.dims[0], " images but ", labels_path, " has ", labels.dims[0], " labels");
  const int64_t n = images.dims[0];
  MIRRORED_ENFORCE(limit >= 0 && limit <= n, mirrored::InvalidArgumentError, "asked for ", limit, " examples of ",
                   images_path, ", which has ", n);
  const int64_t keep = limit > 0 ? limit : n;
  Split out;
  out.labels.resize(static_cast<std::size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) {
    const uint8_t label = labels.values[static_cast<std::size_t>(i)];
    MIRRORED_ENFORCE(label < kClasses, mirrored::InvalidArgumentError, labels_path, ": label ", int{label},
                     " of example ", i, " is outside 0..", kClasses - 1);
    out.labels[static_cast<std::size_t>(i)] = label;
  }
  out.images = std::move(images.values);  // the first `keep` images only
  return out;
}

FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit, int64_t test_limit) {
  FashionMnist out;
  out.train =
      load_split(idx_path(dir, "train-images-idx3-ubyte"), idx_path(dir, "train-labels-idx1-ubyte"), train_limit);
  out.test = load_split(idx_path(dir, "t10k-images-idx3-ubyte"), idx_path(dir, "t10k-labels-idx1-ubyte"), test_limit);
  return out;
}

}  // namespace fashion
