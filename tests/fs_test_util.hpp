#pragma once
// File-system helpers of the tests: whole files read and written, a deadline for calls that might
// block (on a FIFO), and running a check without root's privileges (so that file permissions apply).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "child_process.hpp"

namespace mirrored::testing {

/// The bytes of the file at `path`. \throws std::runtime_error when it cannot be read (the test
/// fails, naming the path).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Replaces the file at `path` with `bytes`. \throws std::runtime_error when it cannot be written.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// Runs `fn` on a thread and waits up to `deadline` for it. If it is still running then (blocked),
/// calls `unblock` until it returns, so that the test fails instead of hanging. Returns whether
/// `fn` finished in time; rethrows what `fn` threw.
inline bool finishes_within(std::chrono::milliseconds deadline, const std::function<void()>& fn,
                            const std::function<void()>& unblock) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::exception_ptr error;
  std::thread t([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    done.set_value();
  });
  const bool in_time = finished.wait_for(deadline) == std::future_status::ready;
  while (finished.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) unblock();
  t.join();
  if (error) std::rethrow_exception(error);
  return in_time;
}

/// Releases a reader blocked opening (or reading) the FIFO `path`: opens it for writing and closes
/// it again, which hands the reader an end of file.
inline void release_fifo_reader(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
}

/// Runs `check` in a child process that has dropped root's privileges (to nobody, 65534), so that
/// file permissions apply, and returns its result (`check`'s return value, or -1 when the child
/// died). When the tests do not run as root, `check` runs in the child as is. nullopt: the
/// privileges could not be dropped (no CAP_SETUID), so the check cannot be made.
inline std::optional<int> run_unprivileged(const std::function<int()>& check) {
  int status = -1;
  try {
    ChildProcess child([&](const ChildProcess::Ready&) {
      if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 125;
      try {
        return check();
      } catch (...) {
        return 124;
      }
    });
    status = child.wait();
  } catch (const std::runtime_error&) {
    return -1;  // no child
  }
  if (!WIFEXITED(status)) return -1;
  if (WEXITSTATUS(status) == 125) return std::nullopt;
  return WEXITSTATUS(status);
}

}  // namespace mirrored::testing
