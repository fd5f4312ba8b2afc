#pragma once
/// \file
/// The example programs' fault-injection hook (train_digits, fashion_mnist; tests/cluster/test_resume.cpp
/// and tests/fashion/test_fashion_resume.cpp use it): a preemption or a crash at a chosen step.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

namespace examples {

/// MIRRORED_TEST_RAISE_AT_STEP="STEP:SIGNAL[:WORKER[:DELAY_US]]" makes this process (worker WORKER
/// of a multi-worker job, default 0) send itself SIGNAL (TERM or KILL) after step STEP of the
/// first run of the job (the launcher's restart count, MIRRORED_RESTART_COUNT or torchrun's
/// TORCHELASTIC_RESTART_COUNT, unset or 0), or DELAY_US microseconds later, from
/// another thread (a moment inside a later step or a save). Returns the function to call after
/// every step with the number of steps done, or an empty function when the variable is unset or
/// names another worker or a later run.
inline std::function<void(int64_t)> raise_at_step_hook(int worker_index) {
  const char* spec = std::getenv("MIRRORED_TEST_RAISE_AT_STEP");
  if (!spec) return {};
  for (const char* count : {"MIRRORED_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* restarts = std::getenv(count);
    if (restarts && std::string(restarts) != "0") return {};
  }
  long long step = 0, delay_us = 0;
  char sig[8] = {};
  int worker = 0;
  if (std::sscanf(spec, "%lld:%7[A-Z]:%d:%lld", &step, sig, &worker, &delay_us) < 2 || worker != worker_index)
    return {};
  const int signal = std::string(sig) == "KILL" ? SIGKILL : SIGTERM;
  return [step, signal, delay_us](int64_t done) {
    if (done != step) return;
    if (delay_us <= 0) {
      ::kill(::getpid(), signal);
      return;
    }
    std::thread([signal, delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      ::kill(::getpid(), signal);
    }).detach();
  };
}

}  // namespace examples
