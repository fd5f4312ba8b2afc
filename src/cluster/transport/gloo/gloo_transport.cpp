// The cross-worker transport over Gloo's TCP transport: a ring all-reduce and, for half-precision
// contributions, an owner all-reduce on Gloo's point-to-point buffers (gloo_ring.hpp says why not
// Gloo's own), all-gather and broadcast of Gloo's algorithm library, with the workers' addresses
// exchanged through the job's store.
#include <gloo/allgatherv.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "cluster/net/socket.hpp"
#include "cluster/transport/gloo/gloo_ring.hpp"
#include "cluster/transport/gloo/gloo_transport.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

// Gloo's view of the job's store: its waits end at the rendezvous deadline.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(KeyValueStore& store, net::Clock::time_point deadline) : store_(store), deadline_(deadline) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_.get(key, net::seconds_until(deadline_));
    MIRRORED_ENFORCE(v, DeadlineExceededError, "Gloo rendezvous: key '", key, "' did not appear in ", store_.describe(),
                     " before the start-up deadline");
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, std::chrono::milliseconds(0)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    const auto missing = store_.wait(keys, net::seconds_until(deadline_));
    MIRRORED_ENFORCE(missing.empty(), DeadlineExceededError, "Gloo rendezvous: key '",
                     missing.empty() ? "" : missing[0], "' did not appear in ", store_.describe(),
                     " before the start-up deadline");
  }

 private:
  KeyValueStore& store_;
  net::Clock::time_point deadline_;
};

std::chrono::milliseconds until(WorkerTransport::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - WorkerTransport::Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

class GlooTransport : public WorkerTransport {
 public:
  GlooTransport(KeyValueStore& store, const std::string& prefix, const std::string& host, int rank, int size,
                net::Clock::time_point deadline) {
    {
      // Gloo's event-loop thread (started with the device) inherits this thread's signal mask:
      // with SIGPIPE blocked there, a write to a peer that went away is an error, never a kill.
      SigpipeBlock block;
      gloo::transport::tcp::attr attr;
      attr.hostname = host;
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(until(deadline));
    GlooStore adapter(store, deadline);
    gloo::rendezvous::PrefixStore prefixed(prefix + "gloo", adapter);
    try {
      SigpipeBlock block;
      context->connectFullMesh(prefixed, device_);
    } catch (const mirrored::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw UnavailableError(str_cat("Gloo could not connect the workers: ", e.what()));
    }
    context_ = std::move(context);
  }

  std::string name() const override { return "Gloo ring over TCP"; }

  void all_reduce_sum(DType dtype, const void* in, void* out, int64_t count, Clock::time_point deadline) override {
    if (count == 0) return;
    run([&] {
      switch (dtype) {
        case DType::float32: return all_reduce_typed<float>(in, out, count, deadline);
        case DType::float64: return all_reduce_typed<double>(in, out, count, deadline);
        case DType::int32: return all_reduce_typed<int32_t>(in, out, count, deadline);
        case DType::int64: return all_reduce_typed<int64_t>(in, out, count, deadline);
        case DType::uint8: return all_reduce_typed<uint8_t>(in, out, count, deadline);
        case DType::float16:
        case DType::bfloat16: return owner_reduce_half(dtype, dtype, in, out, count, deadline);
      }
      throw InternalError("Gloo all-reduce: unknown dtype");
    });
  }

  void all_reduce_half(DType dtype, DType half, const void* in, void* out, int64_t count,
                       Clock::time_point deadline) override {
    if (count == 0) return;
    run([&] { owner_reduce_half(dtype, half, in, out, count, deadline); });
  }

  void all_gather(const void* in, void* out, const std::vector<std::size_t>& sizes,
                  Clock::time_point deadline) override {
    std::size_t total = 0;
    for (auto s : sizes) total += s;
    if (total == 0) return;
    run([&] {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<char*>(static_cast<const char*>(in)), sizes[static_cast<std::size_t>(context_->rank)]);
      opts.setOutput(static_cast<char*>(out), sizes);
      opts.setTag(next_tag());
      opts.setTimeout(until(deadline));
      gloo::allgatherv(opts);
    });
  }

  void broadcast(void* buf, std::size_t bytes, Clock::time_point deadline) override {
    if (bytes == 0) return;
    run([&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<char*>(buf), bytes);
      opts.setRoot(0);
      opts.setTag(next_tag());
      opts.setTimeout(until(deadline));
      gloo::broadcast(opts);
    });
  }

  void interrupt() noexcept override {
    std::lock_guard lock(interrupt_mu_);
    interrupted_.store(true);
    // A wait on a buffer that never receives anything times out at once; Gloo then closes every
    // connection of the context and fails every operation pending on them (its own handling of
    // an application timeout), which releases an operation in flight on another thread. The
    // closed connections in turn fail the peers' operations that wait on this worker.
    try {
      char dummy = 0;
      auto buf = context_->createUnboundBuffer(&dummy, 1);
      buf->waitRecv(nullptr, std::chrono::milliseconds(1));
    } catch (...) {
      // Expected: the wait timed out (or the connections were already closed).
    }
  }

 private:
  // Blocks SIGPIPE in the calling thread while alive; a SIGPIPE raised meanwhile by a write to a
  // closed connection is consumed, so that it is never delivered when the mask is restored.
  struct SigpipeBlock {
    sigset_t pipe_set, old_set;
    bool was_pending = false;
    SigpipeBlock() {
      sigemptyset(&pipe_set);
      sigaddset(&pipe_set, SIGPIPE);
      sigset_t pending;
      sigpending(&pending);
      was_pending = sigismember(&pending, SIGPIPE) == 1;
      pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    }
    ~SigpipeBlock() {
      sigset_t pending;
      sigpending(&pending);
      if (!was_pending && sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        sigtimedwait(&pipe_set, nullptr, &zero);
      }
      pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
    }
  };

  template <class T>
  void all_reduce_typed(const void* in, void* out, int64_t count, Clock::time_point deadline) {
    // Sums with the host backend's kernel ((own + incoming) in that order), as every host
    // reduction here.
    const DType dtype = dtype_of<T>();
    auto reduce = [dtype](void* dst, const void* own, const void* incoming, std::size_t elements) {
      const void* parts[2] = {own, incoming};
      backend_for(cpu0).sum_n(dtype, parts, 2, dst, static_cast<int64_t>(elements));
    };
    ring_all_reduce(*context_, in, out, static_cast<std::size_t>(count), sizeof(T), reduce, next_tag(), deadline,
                    scratch_);
  }

  // Halves cross, and each block's owner sums every worker's at once (owner_all_reduce; the ring
  // would round a half partial sum at every hop): the host backend rounds each contribution to
  // `half`, its sum_n adds a block's halves in float in worker order and rounds once, and `cast`
  // widens the result exactly.
  void owner_reduce_half(DType dtype, DType half, const void* in, void* out, int64_t count,
                         Clock::time_point deadline) {
    auto& host = backend_for(cpu0);
    const std::size_t elem = dtype_size(dtype);
    const int workers = context_->size;
    const auto* src = static_cast<const unsigned char*>(in);
    auto* dst = static_cast<unsigned char*>(out);
    const WireCodec codec{[&](void* wire, std::size_t first, std::size_t n) {
                            host.cast(dtype, src + first * elem, half, wire, static_cast<int64_t>(n));
                          },
                          [&](void* wire, const void* const* parts, std::size_t n) {
                            host.sum_n(half, parts, workers, wire, static_cast<int64_t>(n));
                          },
                          [&](std::size_t first, const void* wire, std::size_t n) {
                            host.cast(half, wire, dtype, dst + first * elem, static_cast<int64_t>(n));
                          }};
    owner_all_reduce(*context_, static_cast<std::size_t>(count), dtype_size(half), codec, next_tag(), deadline,
                     scratch_);
  }

  uint32_t next_tag() noexcept { return tag_++ & 0x7fffffffu; }

  template <class Body>
  void run(Body body) {
    if (interrupted_.load()) throw TransportError{false, "the transport was shut down after an earlier failure"};
    SigpipeBlock block;
    try {
      body();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw TransportError{what.find("Timed out") != std::string::npos && !interrupted_.load(), what};
    }
  }

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mu_;
  uint32_t tag_ = 1;
  std::vector<unsigned char> scratch_;  // ring_all_reduce's and owner_all_reduce's, reused (calls are serial)
};

}  // namespace

std::unique_ptr<WorkerTransport> make_gloo_transport(KeyValueStore& store, const std::string& prefix,
                                                     const std::string& host, int rank, int size,
                                                     std::chrono::steady_clock::time_point deadline) {
  return std::make_unique<GlooTransport>(store, prefix, host, rank, size, deadline);
}

WorkerTransport::~WorkerTransport() = default;

}  // namespace mirrored::detail::cluster
