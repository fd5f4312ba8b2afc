#pragma once
// Test helpers. Replica functions and rank threads never call gtest: they record what they see,
// and assertions run on the main thread afterwards.

#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace mirrored::testing {

/// Built with ASan or TSan: every run is 10-50x slower, so long loops run fewer rounds there.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// Runs `fn(rank)` on `n` threads at once and rethrows the first exception in the caller.
template <class Fn>
void run_ranks(int n, Fn fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// CPU device names "CPU:0" … "CPU:n-1".
inline std::vector<std::string> cpus(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("CPU:" + std::to_string(i));
  return out;
}

/// What a replica observed: the type name and message of the exception it saw, if any.
struct Seen {
  std::string type;
  std::string what;
};

/// Calls `body()` and records which library error it threw (then rethrows it), so tests can
/// check what the *other* replicas saw after one failed.
template <class Body>
auto recording(std::optional<Seen>& slot, Body body) -> decltype(body()) {
  try {
    return body();
  } catch (const AbortedError& e) {
    slot = Seen{"AbortedError", e.what()};
    throw;
  } catch (const DeadlineExceededError& e) {
    slot = Seen{"DeadlineExceededError", e.what()};
    throw;
  } catch (const FailedPreconditionError& e) {
    slot = Seen{"FailedPreconditionError", e.what()};
    throw;
  } catch (const InvalidArgumentError& e) {
    slot = Seen{"InvalidArgumentError", e.what()};
    throw;
  } catch (const std::exception& e) {
    slot = Seen{"std::exception", e.what()};
    throw;
  }
}

/// Message of the exception `fn` throws as `E` ("" if it throws nothing; other types propagate).
template <class E, class Fn>
std::string message_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

/// Polls (sleeping 200 us between tries) until `done()` or 30 s have passed; returns `done()`'s
/// last answer. A generous bound for something that must happen, never a timing claim.
template <class Done>
bool eventually(Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace mirrored::testing
