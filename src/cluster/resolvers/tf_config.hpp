#pragma once
// Private: TF_CONFIG's parser (one function over a string, also the fuzzing entry point) and
// the rules a multi-worker cluster must follow (TF's multi_worker_util), which give every task
// its rank.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mirrored/cluster_resolver.hpp"

namespace mirrored::detail::cluster {

/// What TF_CONFIG says; absent keys stay unset.
struct TfConfig {
  ClusterSpec cluster;
  std::optional<std::string> task_type;
  std::optional<int> task_id;
  std::optional<std::string> rpc_layer;
};

/// Parses the text of TF_CONFIG. Empty or whitespace-only text is an empty configuration.
/// \throws InvalidArgumentError for malformed JSON (a duplicate key included) or a known key of
/// the wrong form, naming the key ("TF_CONFIG: cluster.worker[1] must be a \"host:port\" string").
TfConfig parse_tf_config(std::string_view text);

/// The multi-worker view of a cluster and this task's place in it.
struct ClusterLayout {
  int num_workers = 1;
  int rank = 0;           // 0 = the chief (or worker 0 when there is no chief job)
  std::string task_type;  // this task's job ("worker" for a single local worker)
  int task_id = 0;
  // host:port of each rank (none for a single local worker); "" for a worker whose address is
  // not known in advance (a launcher that names only the chief's), never for the chief.
  std::vector<std::string> addresses;
  std::vector<std::string> names;  // "chief 0 (host:port)", "worker 1 (host:port)", "worker 2", … per rank
  bool is_chief() const noexcept { return rank == 0; }
  /// The host this worker's cross-worker transport listens on: its own address's, or, when that
  /// is empty, this machine's address on the route to the chief (which the other workers reach it
  /// by). \throws InvalidArgumentError when the chief's host does not resolve; UnavailableError
  /// when no route to it exists.
  std::string own_host() const;
};

/// Applies TF's rules to a cluster and this task: jobs are "chief", "worker", "evaluator" and
/// "ps"; at most one chief and one evaluator; addresses are "host:port" (or empty, except the
/// chief's: see ClusterSpec); the task's type is in
/// the cluster and its index in range; ranks are the chief first, then the workers in index
/// order. An empty cluster is one local worker. `source` names the origin in messages
/// ("TF_CONFIG", "the cluster resolver"). \throws InvalidArgumentError naming the key for any
/// violation, and for "ps" and "evaluator" tasks, which cannot join collectives.
ClusterLayout resolve_layout(const ClusterSpec& cluster, const std::string& task_type, int task_id,
                             const std::string& source);

}  // namespace mirrored::detail::cluster
