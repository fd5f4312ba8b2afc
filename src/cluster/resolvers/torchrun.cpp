// TorchrunClusterResolver: torchrun's (torch.distributed's env://) variables.
#include "cluster/resolvers/launcher_env.hpp"
#include "mirrored/cluster_resolver.hpp"

namespace mirrored {

TorchrunClusterResolver::TorchrunClusterResolver(std::string rpc_layer)
    : LauncherClusterResolver("TorchrunClusterResolver", "torchrun's", {"RANK"}, {"WORLD_SIZE"}, {"LOCAL_RANK"},
                              {"LOCAL_WORLD_SIZE"}, std::move(rpc_layer)) {
  restart_count_ =
      detail::cluster::env_number("TorchrunClusterResolver", {"TORCHELASTIC_RESTART_COUNT"}).value.value_or(0);
}

}  // namespace mirrored
