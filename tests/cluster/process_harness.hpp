#pragma once
// Test helper: runs the workers of a multi-worker job as child processes on 127.0.0.1, each with
// its TF_CONFIG, its output in a file. No process outlives the test: every worker is in a process
// group of its own, dies with the test (PR_SET_PDEATHSIG) and is killed and reaped when the Job
// goes away; and the test process is a child subreaper, so that what a child started (the
// launcher's workers) comes back to it when that child dies, and is killed and reaped too.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace mirrored::testing {

/// A TCP port on 127.0.0.1 that was free a moment ago, for a worker to listen on later.
///
/// Chosen below the kernel's ephemeral range (ip_local_port_range) when there is room: a port the
/// kernel hands out itself (bind to port 0, the local end of an outgoing connection) could be taken
/// by any other test's connection between this pick and the worker's bind, and the worker then
/// fails with EADDRINUSE. Below the range only a deliberate listener can take it, and the probe
/// (bound as the chief binds, with SO_REUSEADDR) sees that. A port handed out once in this process
/// is not handed out again.
inline int free_port() {
  int lo = 32768, hi = 60999;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> lo >> hi;
  int first = 10000, last = lo - 1;  // below the ephemeral range
  if (last - first < 2000) {
    first = hi + 1;  // else above it
    last = 65535;
  }
  if (last - first < 2000) {
    first = 1024;  // else anywhere unprivileged (a crowded machine's last resort)
    last = 65535;
  }
  static std::mutex mu;
  static std::set<int> handed_out;
  static std::mt19937 rng(std::random_device{}());
  std::lock_guard lock(mu);
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = std::uniform_int_distribution<int>(first, last)(rng);
    if (handed_out.count(port)) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket");
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) {
      handed_out.insert(port);
      return port;
    }
  }
  throw std::runtime_error("no free port on 127.0.0.1 between " + std::to_string(first) + " and " +
                           std::to_string(last));
}

/// A fresh directory under TMPDIR (or /tmp), removed with the object.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/mirrored-mw-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The TF_CONFIG of worker `rank` of a cluster of workers at `addresses` (worker 0 is the chief).
inline std::string tf_config(const std::vector<std::string>& addresses, int rank) {
  std::string workers;
  for (const auto& a : addresses) workers += (workers.empty() ? "\"" : ", \"") + a + "\"";
  return "{\"cluster\": {\"worker\": [" + workers +
         "]}, \"task\": {\"type\": \"worker\", \"index\": " + std::to_string(rank) + "}}";
}

// Pids of the live Jobs' workers (what is not among them and is our child is an orphan).
inline std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
inline std::set<pid_t>& registry() {
  static std::set<pid_t> pids;
  return pids;
}

/// Kills and reaps this process's children that no live Job started (descendants of a dead child,
/// adopted by this subreaper).
inline void reap_orphans() {
  std::vector<pid_t> orphans;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* e = ::readdir(proc)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid <= 0) continue;
      std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
      std::string text;
      std::getline(stat, text);
      const auto close = text.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(text.substr(close + 2));
      std::string state;
      long ppid = 0;
      rest >> state >> ppid;
      if (ppid == ::getpid()) orphans.push_back(pid);
    }
    ::closedir(proc);
  }
  std::lock_guard lock(registry_mu());
  for (pid_t pid : orphans) {
    if (registry().count(pid)) continue;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
}

/// The TF_CONFIGs of a Job's processes, made from its workers' addresses (one per process).
struct TfConfigs {
  std::function<std::vector<std::string>(const std::vector<std::string>&)> make;
};

class Job {
 public:
  /// A cluster of `total` workers on 127.0.0.1; starts the ranks in `start`, each running `argv`
  /// with `env` added to this process's environment (and its TF_CONFIG and a fresh job id).
  Job(int total, const std::vector<int>& start, const std::vector<std::string>& argv,
      const std::map<std::string, std::string>& env = {}) {
    const std::string job_id = prepare(total);
    for (int rank : start) {
      std::map<std::string, std::string> vars = env;
      vars["TF_CONFIG"] = tf_config(addresses_, rank);
      vars["MIRRORED_JOB_ID"] = job_id;
      spawn(rank, argv, vars);
    }
  }

  /// Processes whose TF_CONFIGs the test makes (workers configured differently): process k runs
  /// `argv` with `env` and TF_CONFIG `tf_configs.make(addresses)[k]`, where `addresses` are `total`
  /// free ports; it is "rank" k for `wait_for`, `code` and `output`. They share a fresh job id
  /// unless `env` sets MIRRORED_JOB_ID ("" for none: the job id derived from the cluster).
  Job(const TfConfigs& tf_configs, int total, const std::vector<std::string>& argv,
      const std::map<std::string, std::string>& env = {}) {
    const std::string job_id = prepare(total);
    const std::vector<std::string> configs = tf_configs.make(addresses_);
    for (std::size_t k = 0; k < configs.size(); ++k) {
      std::map<std::string, std::string> vars = env;
      vars["TF_CONFIG"] = configs[k];
      vars.emplace("MIRRORED_JOB_ID", job_id);
      spawn(static_cast<int>(k), argv, vars);
    }
  }

  /// Processes that a launcher, or the test itself, configures (no TF_CONFIG and no job id of the
  /// harness): process k runs `argv` with `env` and `per_process[k]` added to this process's
  /// environment, TF_CONFIG and MIRRORED_JOB_ID removed unless given there.
  Job(const std::vector<std::map<std::string, std::string>>& per_process, const std::vector<std::string>& argv,
      const std::map<std::string, std::string>& env = {}) {
    prepare(0);
    for (std::size_t k = 0; k < per_process.size(); ++k) {
      std::map<std::string, std::string> vars = env;
      for (const auto& [name, value] : per_process[k]) vars[name] = value;
      spawn(static_cast<int>(k), argv, vars, {"TF_CONFIG", "MIRRORED_JOB_ID"});
    }
  }

  // What every job does first: makes this process the subreaper (a killed worker's children come
  // back here), picks `total` free ports, and returns a fresh job id.
  std::string prepare(int total) {
    static std::once_flag subreaper;
    std::call_once(subreaper, [] { ::prctl(PR_SET_CHILD_SUBREAPER, 1); });
    for (int w = 0; w < total; ++w) addresses_.push_back("127.0.0.1:" + std::to_string(free_port()));
    std::random_device rd;
    return "test-" + std::to_string(rd()) + "-" + std::to_string(::getpid());
  }

  ~Job() {
    for (auto& [rank, p] : procs_) {
      if (!p.done) {
        ::kill(-p.pid, SIGKILL);
        ::kill(p.pid, SIGKILL);
        int status = 0;
        ::waitpid(p.pid, &status, 0);
      }
      std::lock_guard lock(registry_mu());
      registry().erase(p.pid);
    }
    reap_orphans();
  }

  /// Waits until every started worker has exited, at most `timeout_s`; true if all did.
  bool wait(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      bool all = true;
      for (auto& [rank, p] : procs_) {
        if (p.done) continue;
        int status = 0;
        if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
          p.done = true;
          p.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  /// Waits for one worker only.
  bool wait_for(int rank, double timeout_s) {
    Proc& p = procs_.at(rank);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!p.done) {
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.done = true;
        p.code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  /// Waits until worker `rank` has printed `text` (or exited), at most `timeout_s`; true if it printed it.
  bool wait_for_output(int rank, const std::string& text, double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (output(rank).find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= deadline || wait_for(rank, 0))
        return output(rank).find(text) != std::string::npos;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  /// Exit status of `rank` (negative: killed by that signal); meaningful after `wait`.
  int code(int rank) const { return procs_.at(rank).code; }
  bool done(int rank) const { return procs_.at(rank).done; }

  /// Sends `sig` to worker `rank`'s process.
  void signal(int rank, int sig) { ::kill(procs_.at(rank).pid, sig); }

  /// What worker `rank` printed.
  std::string output(int rank) const {
    std::ifstream in(procs_.at(rank).out);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  /// Every started worker's output, labelled (for failure messages).
  std::string outputs() const {
    std::string all;
    for (const auto& [rank, p] : procs_)
      all += "---- worker " + std::to_string(rank) + " (exit " + std::to_string(p.code) + ") ----\n" + output(rank);
    return all;
  }

  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::string& dir() const { return dir_.path(); }

 private:
  struct Proc {
    pid_t pid = -1;
    std::string out;
    bool done = false;
    int code = -1000;
  };

  // Starts `argv` as process `rank` with this process's environment, less the variables of
  // `removed`, plus `vars`.
  void spawn(int rank, const std::vector<std::string>& argv, const std::map<std::string, std::string>& vars,
             const std::set<std::string>& removed = {}) {
    Proc p;
    p.out = dir_.path() + "/worker" + std::to_string(rank) + ".out";
    // Everything the child needs is prepared before fork (the child only calls async-signal-safe
    // functions).
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const std::string key = entry.substr(0, entry.find('='));
      if (!vars.count(key) && !removed.count(key)) env_strings.push_back(entry);
    }
    for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp, args;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    const int out = ::open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) throw std::runtime_error("cannot create " + p.out);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(out);
    ::setpgid(pid, pid);
    p.pid = pid;
    procs_[rank] = p;
    std::lock_guard lock(registry_mu());
    registry().insert(pid);
  }

  TempDir dir_;
  std::vector<std::string> addresses_;
  std::map<int, Proc> procs_;
};

}  // namespace mirrored::testing
