// The `file:` store: one file per key in a directory of a shared file system. A value is written
// to a temporary file (created exclusively, never through a symbolic link) and renamed into
// place, so readers see whole values only; "set if absent" links the temporary file instead,
// which fails when the key exists. Readers open without following links and without blocking on
// FIFOs, and accept only regular files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "cluster/net/socket.hpp"
#include "cluster/store/store.hpp"
#include "mirrored/errors.hpp"
#include "util/fnv1a.hpp"

namespace mirrored::detail::cluster {
namespace {

constexpr off_t kMaxValueBytes = 16 << 20;

// A file name for `key`: safe characters kept, others escaped as %XX; long keys shortened with a
// hash so that names stay within NAME_MAX.
std::string file_name(const std::string& key) {
  std::string out = "k.";
  static const char* hex = "0123456789abcdef";
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.size() > 200) {
    uint64_t h = fnv1a(key);
    std::string tail;
    for (int i = 0; i < 16; ++i, h >>= 4) tail += hex[h & 15];
    out = out.substr(0, 180) + "." + tail;
  }
  return out;
}

class FileStore : public KeyValueStore {
 public:
  explicit FileStore(std::string path) : path_(std::move(path)) {
    dir_.reset(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    MIRRORED_ENFORCE(dir_, InvalidArgumentError, "file store: '", path_, "' is not a directory we can open (",
                     std::strerror(errno), ")");
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  }

  void set(const std::string& key, const std::string& value) override {
    const std::string tmp = write_temp(value);
    if (::renameat(dir_.get(), tmp.c_str(), dir_.get(), file_name(key).c_str()) != 0) {
      const int err = errno;
      ::unlinkat(dir_.get(), tmp.c_str(), 0);
      throw UnavailableError(str_cat("file store ", path_, ": cannot set '", key, "': ", std::strerror(err)));
    }
  }

  bool set_if_absent(const std::string& key, const std::string& value) override {
    const std::string tmp = write_temp(value);
    const int rc = ::linkat(dir_.get(), tmp.c_str(), dir_.get(), file_name(key).c_str(), 0);
    const int err = errno;
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    if (rc == 0) return true;
    if (err == EEXIST) return false;
    throw UnavailableError(str_cat("file store ", path_, ": cannot set '", key, "': ", std::strerror(err)));
  }

  std::optional<std::string> get(const std::string& key, double timeout_s) override {
    const auto deadline = net::deadline_after(timeout_s);
    while (true) {
      if (auto v = read(key)) return v;
      if (net::seconds_until(deadline) <= 0) return std::nullopt;
      pause(deadline);
    }
  }

  std::vector<std::string> wait(const std::vector<std::string>& keys, double timeout_s) override {
    const auto deadline = net::deadline_after(timeout_s);
    while (true) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (!exists(k)) missing.push_back(k);
      if (missing.empty() || net::seconds_until(deadline) <= 0) return missing;
      pause(deadline);
    }
  }

  std::string describe() const override { return "the file store in " + path_; }

 private:
  static void pause(net::Clock::time_point deadline) {
    std::this_thread::sleep_for(
        std::min<net::Clock::duration>(std::chrono::milliseconds(10), deadline - net::Clock::now()));
  }

  bool exists(const std::string& key) const {
    struct stat st;
    return ::fstatat(dir_.get(), file_name(key).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
  }

  std::optional<std::string> read(const std::string& key) const {
    net::Fd fd(::openat(dir_.get(), file_name(key).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd) {
      if (errno == ENOENT) return std::nullopt;
      throw UnavailableError(str_cat("file store ", path_, ": cannot read '", key, "': ", std::strerror(errno)));
    }
    struct stat st;
    MIRRORED_ENFORCE(::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxValueBytes,
                     UnavailableError, "file store ", path_, ": '", key,
                     "' is not a regular file of at most 16 MiB; remove it");
    std::string out(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      MIRRORED_ENFORCE(n > 0, UnavailableError, "file store ", path_, ": reading '", key,
                       "' failed: ", n == 0 ? "it shrank while being read" : std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    return out;
  }

  std::string write_temp(const std::string& value) {
    std::string name;
    {
      std::lock_guard lock(mu_);
      name = str_cat(".tmp.", ::getpid(), ".", rng_());
    }
    net::Fd fd(::openat(dir_.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    MIRRORED_ENFORCE(fd, UnavailableError, "file store ", path_,
                     ": cannot create a temporary file: ", std::strerror(errno));
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd.get(), value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::unlinkat(dir_.get(), name.c_str(), 0);
        throw UnavailableError(str_cat("file store ", path_, ": writing failed: ", std::strerror(err)));
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) {
      const int err = errno;
      ::unlinkat(dir_.get(), name.c_str(), 0);
      throw UnavailableError(str_cat("file store ", path_, ": fsync failed: ", std::strerror(err)));
    }
    return name;
  }

  std::string path_;
  net::Fd dir_;
  std::mutex mu_;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<KeyValueStore> make_file_store(const std::string& path) { return std::make_unique<FileStore>(path); }

}  // namespace mirrored::detail::cluster
