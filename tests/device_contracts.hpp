#pragma once
// Checks of the completion guarantees the device-generic code gives ("complete on return"): the
// result is read back with the backend's copy_to_host and *no* synchronize(), which the simulated
// GPU does not order after queued work. On simulated GPUs the devices' next work is made to start
// 20 ms late, so a helper that returns before its copy or kernel has run fails here every time
// (on CUDA, copy_to_host is stream-ordered and these pass anyway). Called on the test thread;
// reports through gtest.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>
#include "collectives/collective_helpers.hpp"
#include "device/simulated/sim_backend.hpp"
#include "device/simulated/sim_runtime.hpp"

namespace mirrored::contracts {

// What `t`'s device memory holds, read without synchronising first.
template <class T>
std::vector<T> read_unsynchronized(const Tensor<T>& t) {
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  if (!out.empty()) detail::backend_for(t.device()).copy_to_host(out.data(), t.data(), t.bytes());
  return out;
}

// On simulated GPUs: the next work on the compute streams of `a` and `b` starts 20 ms from now.
inline void slow_down(const Device& a, const Device& b) {
  for (const Device* d : {&a, &b})
    if (detail::sim::Backend* s = detail::simulated_backend(*d))
      s->delay_next(detail::StreamKind::compute, std::chrono::milliseconds(20));
}

// A tensor on `d` whose values come from a kernel just enqueued there: {i * 3 + 1 + seed}.
inline Tensor<int32_t> fresh(const Device& d, int64_t n, int32_t seed) {
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
  return Tensor<int32_t>::from_vector(v, {n}, d) * int32_t{3} + (1 + seed);
}

inline std::vector<int32_t> expected_fresh(int64_t n, int32_t seed) {
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<int32_t>(i * 3 + 1 + seed);
  return v;
}

/// copy_between, sum_parts_on and concat_into between every pair of `devices` (each with itself
/// too): their results are complete when they return, except what stays on one device (a copy
/// within it, a sum into an output on the summing device), which is ordered on its stream like a
/// kernel: it is complete once that stream is synchronized, and the host did not wait for it.
inline void expect_complete_on_return(const std::vector<Device>& devices) {
  constexpr int64_t kN = 40000;
  // Values differ from check to check, so that memory left over from an earlier one (blocks are
  // recycled) never passes for a result.
  int32_t seed = 0;
  for (const Device& from : devices) {
    for (const Device& to : devices) {
      const std::string pair = from.short_name() + " -> " + to.short_name();
      seed += 100;
      // copy_between
      const auto src = fresh(from, kN, seed);
      auto dst = Tensor<int32_t>::empty({kN}, to);
      slow_down(from, to);
      detail::copy_between(dst.data(), to, src.data(), from, src.bytes());
      if (from == to) detail::backend_for(to).synchronize();
      EXPECT_EQ(read_unsynchronized(dst), expected_fresh(kN, seed)) << "copy_between " << pair;
      // sum_parts_on: parts on both devices, summed on `from`, into an output on `to`
      const auto a = fresh(from, kN, seed + 1);
      const auto b = fresh(to, kN, seed + 2);
      auto sum = Tensor<int32_t>::empty({kN}, to);
      const auto ua = detail::TensorAccess::erase(a), ub = detail::TensorAccess::erase(b);
      slow_down(from, to);
      detail::sum_parts_on({&ua, &ub}, detail::TensorAccess::erase(sum), from, 0);
      if (from == to) detail::backend_for(to).synchronize();
      std::vector<int32_t> want(static_cast<std::size_t>(kN));
      const auto ea = expected_fresh(kN, seed + 1), eb = expected_fresh(kN, seed + 2);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = ea[i] + eb[i];
      EXPECT_EQ(read_unsynchronized(sum), want) << "sum_parts_on " << pair;
      // concat_into along the inner axis (strided copies on the output's device)
      const auto p = fresh(from, kN, seed + 3).reshape({kN / 2, 2});
      const auto q = fresh(to, kN, seed + 4).reshape({kN / 2, 2});
      auto cat = Tensor<int32_t>::empty({kN / 2, 4}, to);
      const auto up = detail::TensorAccess::erase(p), uq = detail::TensorAccess::erase(q);
      slow_down(from, to);
      detail::concat_into({&up, &uq}, 1, detail::TensorAccess::erase(cat));
      const auto ep = expected_fresh(kN, seed + 3), eq = expected_fresh(kN, seed + 4);
      std::vector<int32_t> want_cat;
      for (std::size_t r = 0; r < static_cast<std::size_t>(kN / 2); ++r)
        want_cat.insert(want_cat.end(), {ep[2 * r], ep[2 * r + 1], eq[2 * r], eq[2 * r + 1]});
      EXPECT_EQ(read_unsynchronized(cat), want_cat) << "concat_into " << pair;
    }
  }
}

}  // namespace mirrored::contracts
