#include "collectives/packing.hpp"

namespace mirrored::detail {

std::vector<std::vector<std::size_t>> plan_packs(const std::vector<UntypedTensor>& leaves, int64_t bytes_per_pack) {
  std::vector<std::vector<std::size_t>> packs;
  int64_t last_pack_bytes = 0;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const bool same_kind = !packs.empty() && leaves[packs.back().front()].dtype == leaves[i].dtype &&
                           leaves[packs.back().front()].device() == leaves[i].device();
    // Err on the side of few large packs: a pack closes only once it is past the limit.
    if (!same_kind || (bytes_per_pack > 0 && last_pack_bytes > bytes_per_pack)) {
      packs.emplace_back();
      last_pack_bytes = 0;
    }
    packs.back().push_back(i);
    last_pack_bytes += static_cast<int64_t>(leaves[i].bytes());
  }
  return packs;
}

}  // namespace mirrored::detail
