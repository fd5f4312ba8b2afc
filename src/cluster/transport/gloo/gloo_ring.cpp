#include "cluster/transport/gloo/gloo_ring.hpp"

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace mirrored::detail::cluster {
namespace {

// Segments of about this size keep the ring's stages overlapping: while one segment crosses the
// socket, the previous one is being summed.
constexpr std::size_t kSegmentBytes = std::size_t{1} << 20;
// The slot prefix of these messages, apart from those of Gloo's own collectives (0x01-0x08).
constexpr uint8_t kRingSlotPrefix = 0x41;

// What is left of the deadline, at least 1 ms (Gloo treats 0 as "no timeout"). A wait that ends
// without its message throws (Gloo's timeout, or an abort).
std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}
void wait_recv(gloo::transport::UnboundBuffer& buf, std::chrono::steady_clock::time_point deadline) {
  if (!buf.waitRecv(nullptr, left(deadline))) throw std::runtime_error("ring all-reduce: a receive was aborted");
}
void wait_send(gloo::transport::UnboundBuffer& buf, std::chrono::steady_clock::time_point deadline) {
  if (!buf.waitSend(nullptr, left(deadline))) throw std::runtime_error("ring all-reduce: a send was aborted");
}

}  // namespace

void ring_all_reduce(gloo::Context& context, const void* in, void* out, std::size_t elements, std::size_t element_size,
                     const std::function<void(void*, const void*, const void*, std::size_t)>& reduce, uint32_t tag,
                     std::chrono::steady_clock::time_point deadline, std::vector<unsigned char>& scratch) {
  const std::size_t bytes = elements * element_size;
  const int size = context.size;
  if (bytes == 0) return;
  if (size == 1) {
    if (in != out) std::memcpy(out, in, bytes);
    return;
  }
  const int rank = context.rank;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;

  // The buffer is `size` blocks (block b ends fully reduced on rank b - 1, first), each of
  // `per_block` segments; offsets in whole elements, the last ones possibly short or empty.
  const std::size_t block_elements = (elements + static_cast<std::size_t>(size) - 1) / static_cast<std::size_t>(size);
  const std::size_t per_block =
      std::max<std::size_t>(2, (block_elements * element_size + kSegmentBytes - 1) / kSegmentBytes);
  const std::size_t segment_elements = (block_elements + per_block - 1) / per_block;
  auto range = [&](int block, std::size_t segment) {
    const std::size_t b = static_cast<std::size_t>((block % size + size) % size);
    const std::size_t begin =
        std::min(elements, b * block_elements + std::min(block_elements, segment * segment_elements));
    const std::size_t end = std::min(
        {elements, b * block_elements + block_elements, b * block_elements + (segment + 1) * segment_elements});
    return std::pair<std::size_t, std::size_t>{begin * element_size, (end > begin ? end - begin : 0) * element_size};
  };

  auto* const in_bytes = static_cast<unsigned char*>(const_cast<void*>(in));
  auto* const out_bytes = static_cast<unsigned char*>(out);
  const std::size_t scratch_bytes = segment_elements * element_size;
  if (scratch.size() < 2 * scratch_bytes) scratch.resize(2 * scratch_bytes);
  auto in_buf = context.createUnboundBuffer(in_bytes, bytes);
  auto out_buf = context.createUnboundBuffer(out_bytes, bytes);
  auto tmp_buf = context.createUnboundBuffer(scratch.data(), 2 * scratch_bytes);
  const uint64_t slot = gloo::Slot::build(kRingSlotPrefix, tag);

  // Reduce-scatter: step s sends block rank - s to the right and receives block rank - s - 1
  // from the left, adding this rank's input. Units (step, segment) run in order with two
  // receives in flight; a unit's send needs the unit per_block earlier reduced, which it is
  // (units up to two back are), since per_block >= 2.
  const std::size_t units = static_cast<std::size_t>(size - 1) * per_block;
  auto unit_blocks = [&](std::size_t k) {
    const int step = static_cast<int>(k / per_block);
    return std::pair<int, int>{rank - step, rank - step - 1};
  };
  std::size_t sends_pending_in = 0, sends_pending_out = 0;
  auto post = [&](std::size_t k) {
    const auto [send_block, recv_block] = unit_blocks(k);
    const std::size_t seg = k % per_block;
    const auto [recv_off, recv_len] = range(recv_block, seg);
    if (recv_len > 0) tmp_buf->recv(left, slot, (k % 2) * scratch_bytes, recv_len);
    const auto [send_off, send_len] = range(send_block, seg);
    if (send_len > 0) {
      // Step 0 sends this rank's own input; later steps the partial sums received.
      if (k < per_block) {
        in_buf->send(right, slot, send_off, send_len);
        ++sends_pending_in;
      } else {
        out_buf->send(right, slot, send_off, send_len);
        ++sends_pending_out;
      }
    }
  };
  auto finish = [&](std::size_t k) {
    const auto [send_block, recv_block] = unit_blocks(k);
    (void)send_block;
    const auto [off, len] = range(recv_block, k % per_block);
    if (len == 0) return;
    wait_recv(*tmp_buf, deadline);
    reduce(out_bytes + off, in_bytes + off, scratch.data() + (k % 2) * scratch_bytes, len / element_size);
  };
  for (std::size_t k = 0; k < units; ++k) {
    if (k >= 2) finish(k - 2);
    post(k);
  }
  for (std::size_t k = units >= 2 ? units - 2 : 0; k < units; ++k) finish(k);
  // Every send of this phase completes before the all-gather writes into the output (a region
  // still being sent may be the one a later receive overwrites).
  for (; sends_pending_in > 0; --sends_pending_in) wait_send(*in_buf, deadline);
  for (; sends_pending_out > 0; --sends_pending_out) wait_send(*out_buf, deadline);

  // All-gather: step s sends block rank + 1 - s (reduced here at s = 0, received at s - 1) to
  // the right and receives block rank - s from the left, straight into the output.
  // Receives from one peer and slot complete in the order they were posted.
  std::size_t recvs_pending = 0;
  for (int step = 0; step < size - 1; ++step) {
    std::size_t posted = 0;
    for (std::size_t seg = 0; seg < per_block; ++seg) {
      const auto [recv_off, recv_len] = range(rank - step, seg);
      if (recv_len > 0) {
        out_buf->recv(left, slot, recv_off, recv_len);
        ++posted;
      }
    }
    // What this step sends is what the previous step received: wait for all of it first.
    for (; recvs_pending > 0; --recvs_pending) wait_recv(*out_buf, deadline);
    recvs_pending = posted;
    for (std::size_t seg = 0; seg < per_block; ++seg) {
      const auto [send_off, send_len] = range(rank + 1 - step, seg);
      if (send_len > 0) {
        out_buf->send(right, slot, send_off, send_len);
        ++sends_pending_out;
      }
    }
  }
  for (; recvs_pending > 0; --recvs_pending) wait_recv(*out_buf, deadline);
  for (; sends_pending_out > 0; --sends_pending_out) wait_send(*out_buf, deadline);
}

}  // namespace mirrored::detail::cluster
