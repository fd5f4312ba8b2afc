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
// The slot prefixes of these messages, apart from those of Gloo's own collectives (0x01-0x08).
constexpr uint8_t kRingSlotPrefix = 0x41;
constexpr uint8_t kContributionSlotPrefix = 0x42;  // owner_all_reduce: a contribution to an owner
constexpr uint8_t kResultSlotPrefix = 0x43;        // owner_all_reduce: an owner's result
// How many copies of each area owner_all_reduce cycles through: a segment's contributions go out
// one segment ahead, and its results are decoded one segment later.
constexpr std::size_t kOwnerDepth = 3;
// Its segments: as large as its scratch budget allows, up to 1 MiB (fewer, larger messages cost
// less per byte: with 128 KiB ones a 64 MiB all-reduce was clearly slower), at least 64 KiB.
constexpr std::size_t kOwnerScratchBytes = std::size_t{24} << 20;
constexpr std::size_t kOwnerMaxSegmentBytes = std::size_t{1} << 20;
constexpr std::size_t kOwnerMinSegmentBytes = std::size_t{64} << 10;

// What is left of the deadline, at least 1 ms (Gloo treats 0 as "no timeout"). A wait that ends
// without its message throws (Gloo's timeout, or an abort).
std::chrono::milliseconds left(std::chrono::steady_clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}
void wait_recv(gloo::transport::UnboundBuffer& buf, std::chrono::steady_clock::time_point deadline) {
  if (!buf.waitRecv(nullptr, left(deadline))) throw std::runtime_error("Gloo: a receive was aborted");
}
void wait_send(gloo::transport::UnboundBuffer& buf, std::chrono::steady_clock::time_point deadline) {
  if (!buf.waitSend(nullptr, left(deadline))) throw std::runtime_error("Gloo: a send was aborted");
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

void owner_all_reduce(gloo::Context& context, std::size_t elements, std::size_t wire_size, const WireCodec& codec,
                      uint32_t tag, std::chrono::steady_clock::time_point deadline,
                      std::vector<unsigned char>& scratch) {
  if (elements == 0) return;
  const int size = context.size;
  const int rank = context.rank;
  const auto ranks = static_cast<std::size_t>(size);
  // Block b (owned by rank b) is `segments` segments; offsets in whole elements, the last ones
  // possibly short or empty (every rank computes the same ranges, so it skips the same messages).
  const std::size_t block_elements = (elements + ranks - 1) / ranks;
  // Every area's copies (3 per peer and 2 of this rank's), within the budget.
  const std::size_t areas = (3 * ranks + 1) * kOwnerDepth;
  const std::size_t target =
      std::clamp(kOwnerScratchBytes / areas / wire_size * wire_size, kOwnerMinSegmentBytes, kOwnerMaxSegmentBytes);
  const std::size_t segments = std::max<std::size_t>(1, (block_elements * wire_size + target - 1) / target);
  const std::size_t segment_elements = (block_elements + segments - 1) / segments;
  auto range = [&](int block, std::size_t segment) {
    const std::size_t start = static_cast<std::size_t>(block) * block_elements;
    const std::size_t begin = std::min(elements, start + std::min(block_elements, segment * segment_elements));
    const std::size_t end = std::min({elements, start + block_elements, begin + segment_elements});
    return std::pair<std::size_t, std::size_t>{begin, end > begin ? end - begin : 0};
  };

  // Segment k of each kind of area uses copy k % kDepth. Per rank w: what this rank contributes
  // to w's block (w == rank: its own contribution), what w contributed to this rank's block, w's
  // result for its block; then this rank's results.
  enum Area : std::size_t { kMine = 0, kTheirs = 1, kGathered = 2, kResult = 3 };
  const std::size_t segment_bytes = segment_elements * wire_size;
  const std::size_t copies_bytes = kOwnerDepth * segment_bytes;  // one area, every copy
  if (scratch.size() < areas * segment_bytes) scratch.resize(areas * segment_bytes);
  auto area = [&](Area a, int w) {
    return scratch.data() + (a == kResult ? 3 * ranks : a * ranks + static_cast<std::size_t>(w)) * copies_bytes;
  };
  auto copy = [&](std::size_t k) { return (k % kOwnerDepth) * segment_bytes; };

  // One buffer per peer and direction: completions on one buffer then come in the order of its
  // operations (one peer, one slot), which the counting below relies on.
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> to_owner(ranks), from_peer(ranks), result_to(ranks),
      result_from(ranks);
  for (int w = 0; w < size; ++w) {
    if (w == rank) continue;
    const auto u = static_cast<std::size_t>(w);
    to_owner[u] = context.createUnboundBuffer(area(kMine, w), copies_bytes);
    from_peer[u] = context.createUnboundBuffer(area(kTheirs, w), copies_bytes);
    result_from[u] = context.createUnboundBuffer(area(kGathered, w), copies_bytes);
    result_to[u] = context.createUnboundBuffer(area(kResult, 0), copies_bytes);
  }
  const uint64_t contribution_slot = gloo::Slot::build(kContributionSlotPrefix, tag);
  const uint64_t result_slot = gloo::Slot::build(kResultSlotPrefix, tag);
  // Sends that may still read a copy: it is written again only once they are done. The oldest
  // send on a buffer completes first, so waiting for one per earlier send is enough.
  std::vector<std::size_t> sends(ranks, 0), result_sends(ranks, 0);  // in flight, per peer
  auto wait_sends = [&](std::vector<std::size_t>& pending,
                        std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>& bufs, std::size_t keep) {
    for (std::size_t u = 0; u < ranks; ++u)
      for (; pending[u] > keep; --pending[u]) wait_send(*bufs[u], deadline);
  };

  // Segment k: its receives are posted, and this rank's contributions to the other blocks sent,
  // one segment ahead, so that an owner finds every contribution there when it gets to k.
  auto start_segment = [&](std::size_t k) {
    wait_sends(sends, to_owner, kOwnerDepth - 1);
    for (int i = 1; i < size; ++i) {
      const int w = (rank + i) % size;
      const auto u = static_cast<std::size_t>(w);
      if (const std::size_t n = range(rank, k).second; n > 0)
        from_peer[u]->recv(w, contribution_slot, copy(k), n * wire_size);
      if (const std::size_t n = range(w, k).second; n > 0) result_from[u]->recv(w, result_slot, copy(k), n * wire_size);
      const auto [first, n] = range(w, k);
      if (n == 0) continue;
      codec.encode(area(kMine, w) + copy(k), first, n);
      to_owner[u]->send(w, contribution_slot, copy(k), n * wire_size);
      ++sends[u];
    }
  };
  // The other owners' results of segment k.
  auto finish_segment = [&](std::size_t k) {
    for (int w = 0; w < size; ++w) {
      if (w == rank) continue;
      const auto [first, n] = range(w, k);
      if (n == 0) continue;
      wait_recv(*result_from[static_cast<std::size_t>(w)], deadline);
      codec.decode(first, area(kGathered, w) + copy(k), n);
    }
  };

  std::vector<const void*> parts(ranks);
  start_segment(0);
  for (std::size_t k = 0; k < segments; ++k) {
    if (k + 1 < segments) start_segment(k + 1);
    // This rank's block: every contribution, in rank order, combined once and sent to every peer.
    if (const auto [first, n] = range(rank, k); n > 0) {
      codec.encode(area(kMine, rank) + copy(k), first, n);
      for (int w = 0; w < size; ++w) {
        parts[static_cast<std::size_t>(w)] = area(w == rank ? kMine : kTheirs, w) + copy(k);
        if (w != rank) wait_recv(*from_peer[static_cast<std::size_t>(w)], deadline);
      }
      wait_sends(result_sends, result_to, kOwnerDepth - 1);
      unsigned char* out = area(kResult, 0) + copy(k);
      codec.combine(out, parts.data(), n);
      for (int w = 0; w < size; ++w) {
        if (w == rank) continue;
        result_to[static_cast<std::size_t>(w)]->send(w, result_slot, copy(k), n * wire_size);
        ++result_sends[static_cast<std::size_t>(w)];
      }
      codec.decode(first, out, n);
    }
    // The results of the segment before, which had a segment's time to arrive.
    if (k > 0) finish_segment(k - 1);
  }
  finish_segment(segments - 1);
  wait_sends(sends, to_owner, 0);
  wait_sends(result_sends, result_to, 0);
}

}  // namespace mirrored::detail::cluster
