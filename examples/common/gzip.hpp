#pragma once
/// \file
/// Reading a whole gzip-compressed (or plain) file, for the examples' data sets (digits, Fashion-MNIST).
/// Needs zlib at link time (`-lz`, CMake's `ZLIB::ZLIB`).

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include <mirrored/errors.hpp>

namespace examples {

/// The streamed parts joined into one string (for error messages).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// Reads a whole gzip file (a plain file is read as is, as zlib does), or its first `max_bytes`
/// decompressed bytes (fewer if it ends first; what follows is not read, nor checked).
/// \throws mirrored::NotFoundError when it does not exist; mirrored::InvalidArgumentError when it
/// cannot be read or the gzip stream (as far as it was read) is corrupt or truncated.
inline std::string read_gzip_file(const std::string& path, std::size_t max_bytes = std::string::npos) {
  errno = 0;
  gzFile raw = gzopen(path.c_str(), "rb");
  if (!raw) {
    const int err = errno;
    if (err == ENOENT) throw mirrored::NotFoundError(concat(path, ": no such file"));
    throw mirrored::InvalidArgumentError(concat(path, ": cannot open: ", err ? std::strerror(err) : "out of memory"));
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(raw, gzclose);
  std::string out;
  char buf[1 << 16];
  while (out.size() < max_bytes) {
    const std::size_t want = std::min(sizeof buf, max_bytes - out.size());
    const int n = gzread(file.get(), buf, static_cast<unsigned>(want));
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (n == 0) break;
  }
  int err = Z_OK;
  const char* msg = gzerror(file.get(), &err);
  if (err != Z_OK && err != Z_STREAM_END)
    throw mirrored::InvalidArgumentError(
        concat(path, ": corrupt or truncated gzip data: ", err == Z_ERRNO ? std::strerror(errno) : msg));
  return out;
}

}  // namespace examples
