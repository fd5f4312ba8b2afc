// Completion waits left to the caller (deferred_completion.hpp).
#include "collectives/deferred_completion.hpp"

#include <exception>
#include <utility>

#include "util/exceptions.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {
thread_local DeferredCompletion* tl_deferred = nullptr;
}  // namespace

DeferredCompletion::DeferredCompletion() noexcept : outer_(tl_deferred) { tl_deferred = this; }

DeferredCompletion::~DeferredCompletion() {
  tl_deferred = outer_;
  try {
    run();
  } catch (...) {
    MIRRORED_LOG(warn, "a collective's completion wait failed after its caller failed: ",
                 describe_exception(std::current_exception()));
  }
}

void DeferredCompletion::run() {
  std::exception_ptr first;
  for (auto waits = std::exchange(waits_, {}); auto& wait : waits) {
    try {
      wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

bool DeferredCompletion::defer(std::function<void()> wait) {
  if (!tl_deferred) return false;
  tl_deferred->waits_.push_back(std::move(wait));
  return true;
}

}  // namespace mirrored::detail
