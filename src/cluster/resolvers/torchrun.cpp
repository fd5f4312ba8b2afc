// TorchrunClusterResolver: torchrun's (torch.distributed's env://) variables.
#include "cluster/resolvers/launcher_env.hpp"
#include "mirrored/cluster_resolver.hpp"

namespace mirrored {

TorchrunClusterResolver::TorchrunClusterResolver(std::string rpc_layer)
    : SettledClusterResolver({}, "worker", 0, std::move(rpc_layer)) {
  using namespace detail::cluster;
  constexpr const char* kWho = "TorchrunClusterResolver";
  LauncherPlace place = launcher_place(kWho, "torchrun's", env_number(kWho, {"RANK"}), env_number(kWho, {"WORLD_SIZE"}),
                                       env_number(kWho, {"LOCAL_RANK"}), env_number(kWho, {"LOCAL_WORLD_SIZE"}));
  restart_count_ = env_number(kWho, {"TORCHELASTIC_RESTART_COUNT"}).value.value_or(0);
  cluster_ = std::move(place.cluster);
  source_ = std::move(place.source);
  task_id_ = place.ranks.rank;
  local_rank_ = place.ranks.local_rank;
  local_world_size_ = place.ranks.local_size;
}

}  // namespace mirrored
