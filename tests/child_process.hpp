#pragma once
// Test helper: a function run in a forked child process — to be killed part way through (a crash
// during a save), to hold what only another process can hold (a file lock), or to die as a peer.
// No child outlives its ChildProcess: one still running is killed and reaped when it goes away.

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <stdexcept>

namespace mirrored::testing {

class ChildProcess {
 public:
  /// Calls `ready()` from the child to tell the parent (`wait_ready`) that it is set up.
  using Ready = std::function<void()>;
  /// Exit statuses of a child whose body did not return normally.
  static constexpr int kThrew = 2;
  static constexpr int kCouldNotSignal = 3;

  /// Forks; the child runs `body` and exits (`_exit`, skipping the test process's atexit work)
  /// with what it returns, kThrew when it throws. \throws std::runtime_error when fork fails.
  explicit ChildProcess(const std::function<int(const Ready& ready)>& body) {
    if (::pipe(ready_) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(ready_[0]);
      ::close(ready_[1]);
      throw std::runtime_error("fork failed");
    }
    if (pid_ == 0) {
      ::close(ready_[0]);
      int rc = kThrew;
      try {
        rc = body([this] {
          const char go = 'g';
          if (::write(ready_[1], &go, 1) != 1) ::_exit(kCouldNotSignal);
        });
      } catch (...) {
        rc = kThrew;
      }
      ::_exit(rc);
    }
    ::close(ready_[1]);
  }
  ~ChildProcess() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    ::close(ready_[0]);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const noexcept { return pid_; }

  /// Blocks until the child calls `ready()` (true) or exits without calling it (false).
  bool wait_ready() {
    char go = 0;
    ssize_t n;
    do {
      n = ::read(ready_[0], &go, 1);
    } while (n < 0 && errno == EINTR);
    return n == 1;
  }

  void kill(int signal = SIGKILL) { ::kill(pid_, signal); }

  /// Waits for the child to end and returns its waitpid status (the same on later calls).
  int wait() {
    if (!reaped_) {
      pid_t r;
      do {
        r = ::waitpid(pid_, &status_, 0);
      } while (r < 0 && errno == EINTR);
      reaped_ = true;
    }
    return status_;
  }

  static bool exited_with(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
  static bool killed_by(int status, int signal) { return WIFSIGNALED(status) && WTERMSIG(status) == signal; }

 private:
  pid_t pid_ = -1;
  int ready_[2] = {-1, -1};
  int status_ = -1;
  bool reaped_ = false;
};

}  // namespace mirrored::testing
