#pragma once
// What the scenarios of mirrored_mw_worker share (mw_worker.cpp has main and most scenarios;
// mw_compression.cpp the compressed collectives): the arguments, the CHECK that counts failures
// instead of stopping, and the strategy's options.

#include <iostream>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace mirrored::mw {

// Checks that failed so far; a scenario exits 1 when any did.
inline int g_failures = 0;

#define CHECK(cond, ...)                                                                                         \
  do {                                                                                                           \
    if (!(cond)) {                                                                                               \
      std::cout << "CHECK FAILED (" << __LINE__ << "): " #cond " " << detail::str_cat(__VA_ARGS__) << std::endl; \
      ++::mirrored::mw::g_failures;                                                                              \
    }                                                                                                            \
  } while (0)

struct Args {
  std::string scenario;
  int replicas = 1;
  double timeout = 30;
  int victim = 1;
  int step = 3;
  std::string implementation = "auto";  // "ring": CommunicationImplementation::RING (TCP between workers)
  bool gpus = false;                    // --gpus 1: replicas on GPU:0..R-1 (compression; simulated GPUs in CI)
  int64_t elements = 1 << 18;           // --elements N: the size of the scenario "big"'s all-reduces
};

inline std::vector<std::string> cpus(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("CPU:" + std::to_string(i));
  return out;
}

inline CommunicationOptions options(double timeout) {
  CommunicationOptions o;
  o.timeout_seconds = timeout;
  return o;
}

/// The scenario "compression" (mw_compression.cpp).
int compression(const Args& a);
/// The scenario "checkpoint" (mw_checkpoint.cpp): CheckpointManager's save and restore across workers.
int checkpoint_scenario(const Args& a);
/// The scenario "uneven" (mw_uneven.cpp): uneven input across workers ends together.
int uneven_scenario(const Args& a);
/// The scenario "uneven_failure" (mw_uneven.cpp): worker K's input pipeline throws at step N.
int uneven_failure_scenario(const Args& a);
/// The scenario "agreement_loop" (mw_uneven.cpp): steps of a distributed dataset until an error.
int agreement_loop_scenario(const Args& a);
/// The scenario "uneven_mismatch" (mw_uneven.cpp): worker 0 takes a step while the others all-reduce.
int uneven_mismatch_scenario(const Args& a);

}  // namespace mirrored::mw
