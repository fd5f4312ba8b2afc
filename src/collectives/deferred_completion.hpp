#pragma once
// Private: completion waits that a collective leaves to its caller. An NCCL collective ends with
// a host wait that only learns whether the device finished its part (NCCL's errors, the deadline,
// aborting the communicators on either); its outputs are already ordered on the stream. An
// asynchronous collective's lane publishes the result first, so that PendingCollective::wait()
// makes the host wait for nothing, and runs these waits after (docs/gpu.md, "Asynchronous
// collectives").

#include <functional>
#include <vector>

namespace mirrored::detail {

/// While it lives, the completion waits that collectives on the constructing thread hand over
/// (`defer`) are kept instead of run. Scopes nest (the innermost takes them). Destroy it on the
/// constructing thread; the destructor runs what `run` did not, logging their failures.
class DeferredCompletion {
 public:
  DeferredCompletion() noexcept;
  ~DeferredCompletion();
  DeferredCompletion(const DeferredCompletion&) = delete;
  DeferredCompletion& operator=(const DeferredCompletion&) = delete;

  /// Runs the waits handed over so far, in order, each once. \throws the first one's failure (the
  /// later ones still run: each aborts what it waits for when it fails).
  void run();

  /// Hands `wait` to the calling thread's innermost DeferredCompletion. False when there is none:
  /// the caller waits itself.
  static bool defer(std::function<void()> wait);

 private:
  DeferredCompletion* outer_;
  std::vector<std::function<void()>> waits_;
};

}  // namespace mirrored::detail
