// ClusterSpec and the cluster resolvers (TF_CONFIG, given, Slurm).
#include "mirrored/cluster_resolver.hpp"

#include <cstdlib>
#include <limits>

#include "cluster/resolvers/tf_config.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

using detail::str_cat;

std::vector<std::string> ClusterSpec::job_tasks(const std::string& job) const {
  auto it = jobs.find(job);
  MIRRORED_ENFORCE(it != jobs.end(), InvalidArgumentError, "ClusterSpec: no job \"", job, "\" in the cluster");
  return it->second;
}

int ClusterSpec::num_tasks(const std::string& job) const {
  auto it = jobs.find(job);
  return it == jobs.end() ? 0 : static_cast<int>(it->second.size());
}

std::string ClusterSpec::task_address(const std::string& job, int index) const {
  const auto tasks = job_tasks(job);
  MIRRORED_ENFORCE(index >= 0 && static_cast<std::size_t>(index) < tasks.size(), InvalidArgumentError,
                   "ClusterSpec: task index ", index, " is out of range for job \"", job, "\" of ", tasks.size(),
                   " tasks");
  return tasks[static_cast<std::size_t>(index)];
}

ClusterResolver::~ClusterResolver() = default;
std::string ClusterResolver::rpc_layer() const { return ""; }
std::string ClusterResolver::source() const { return "the cluster resolver"; }
LocalPlacement ClusterResolver::local_placement() const { return {}; }

TFConfigClusterResolver::TFConfigClusterResolver(std::optional<std::string> task_type, std::optional<int> task_id,
                                                 std::optional<std::string> rpc_layer) {
  const char* env = std::getenv("TF_CONFIG");
  const detail::cluster::TfConfig config = detail::cluster::parse_tf_config(env ? env : "");
  cluster_ = config.cluster;
  task_type_ = task_type.value_or(config.task_type.value_or(""));
  task_id_ = task_id.value_or(config.task_id.value_or(0));
  rpc_layer_ = rpc_layer.value_or(config.rpc_layer.value_or(""));
  source_ = "TF_CONFIG";
}

SimpleClusterResolver::SimpleClusterResolver(ClusterSpec cluster_spec, std::string task_type, int task_id,
                                             std::string rpc_layer)
    : SettledClusterResolver(std::move(cluster_spec), std::move(task_type), task_id, std::move(rpc_layer)) {}

// ---------------------------------------------------------------------------------------------
// Slurm.

namespace detail {
namespace {

int parse_count(const std::string& text, const char* variable) {
  bool ok = !text.empty() && text.size() <= 9;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  MIRRORED_ENFORCE(ok, InvalidArgumentError, "SlurmClusterResolver: ", variable, " has a malformed number '", text,
                   "'");
  return std::stoi(text);
}

// Splits at commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& s, const char* variable) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    MIRRORED_ENFORCE(depth >= 0 && depth <= 1, InvalidArgumentError, "SlurmClusterResolver: ", variable,
                     " has unbalanced brackets: '", s, "'");
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  MIRRORED_ENFORCE(depth == 0, InvalidArgumentError, "SlurmClusterResolver: ", variable, " has unbalanced brackets: '",
                   s, "'");
  out.push_back(cur);
  return out;
}

void expand_item(const std::string& item, const char* variable, std::vector<std::string>& out) {
  const auto open = item.find('[');
  if (open == std::string::npos) {
    MIRRORED_ENFORCE(!item.empty(), InvalidArgumentError, "SlurmClusterResolver: ", variable,
                     " has an empty host name");
    out.push_back(item);
    return;
  }
  const auto close = item.find(']', open);
  const std::string prefix = item.substr(0, open);
  const std::string ranges = item.substr(open + 1, close - open - 1);
  const std::string rest = item.substr(close + 1);
  std::size_t start = 0;
  while (start <= ranges.size()) {
    auto comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string range = ranges.substr(start, comma - start);
    const auto dash = range.find('-');
    const std::string lo_text = range.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
    const int lo = parse_count(lo_text, variable), hi = parse_count(hi_text, variable);
    MIRRORED_ENFORCE(lo <= hi && hi - lo < 1000000, InvalidArgumentError, "SlurmClusterResolver: ", variable,
                     " has a bad range '", range, "'");
    for (int v = lo; v <= hi; ++v) {
      std::string number = std::to_string(v);
      if (number.size() < lo_text.size()) number.insert(0, lo_text.size() - number.size(), '0');  // node[01-03]
      expand_item(prefix + number + rest, variable, out);  // a later bracket group, if any
    }
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list, const char* variable) {
  std::vector<std::string> out;
  for (const auto& item : split_top_level(list, variable)) expand_item(item, variable, out);
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& list, const char* variable) {
  std::vector<int> out;
  for (const auto& item : split_top_level(list, variable)) {
    const auto paren = item.find("(x");
    if (paren == std::string::npos) {
      out.push_back(parse_count(item, variable));
      continue;
    }
    MIRRORED_ENFORCE(item.size() > paren + 3 && item.back() == ')', InvalidArgumentError,
                     "SlurmClusterResolver: ", variable, " has a malformed repeat '", item, "'");
    const int count = parse_count(item.substr(0, paren), variable);
    const int times = parse_count(item.substr(paren + 2, item.size() - paren - 3), variable);
    MIRRORED_ENFORCE(times <= 1000000, InvalidArgumentError, "SlurmClusterResolver: ", variable,
                     " repeats too often: '", item, "'");
    out.insert(out.end(), static_cast<std::size_t>(times), count);
  }
  return out;
}

}  // namespace detail

namespace {

std::string env_of(std::initializer_list<const char*> names, const char** used) {
  for (const char* n : names) {
    if (const char* v = std::getenv(n); v && *v) {
      *used = n;
      return v;
    }
  }
  std::string all;
  for (const char* n : names) all += (all.empty() ? "" : " or ") + std::string(n);
  throw InvalidArgumentError("SlurmClusterResolver: " + all + " is not set (is this process a Slurm job step?)");
}

// SLURM_GPUS_PER_TASK as --gpus-per-task sets it: "[type:]count", several types separated by
// commas ("a100:1,v100:1"), whose counts add up.
int slurm_gpus_per_task(const std::string& text) {
  int total = 0;
  for (const auto& item : detail::split_top_level(text, "SLURM_GPUS_PER_TASK")) {
    const auto colon = item.rfind(':');
    total += detail::parse_count(colon == std::string::npos ? item : item.substr(colon + 1), "SLURM_GPUS_PER_TASK");
  }
  return total;
}

}  // namespace

SlurmClusterResolver::SlurmClusterResolver(std::map<std::string, int> jobs, int port_base, std::string rpc_layer)
    : SettledClusterResolver({}, "", 0, std::move(rpc_layer)) {
  const char* used = nullptr;
  const int rank = detail::parse_count(env_of({"SLURM_PROCID"}, &used), used);
  const int num_tasks = detail::parse_count(env_of({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, &used), used);
  source_ = str_cat("Slurm's variables (SLURM_PROCID=", rank, ", ", used, "=", num_tasks, ")");
  const std::string nodelist_text = env_of({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}, &used);
  const auto nodes = detail::expand_slurm_hostlist(nodelist_text, used);
  const std::string per_node_text = env_of({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &used);
  const auto per_node = detail::expand_slurm_tasks_per_node(per_node_text, used);
  MIRRORED_ENFORCE(per_node.size() == nodes.size(), InvalidArgumentError, "SlurmClusterResolver: ", used, " ('",
                   per_node_text, "') describes ", per_node.size(), " nodes but the node list has ", nodes.size());
  MIRRORED_ENFORCE(port_base >= 1 && port_base <= 65535, InvalidArgumentError,
                   "SlurmClusterResolver: port_base must be in 1..65535, got ", port_base);
  std::vector<std::string> addresses;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    for (int k = 0; k < per_node[n]; ++k) {
      MIRRORED_ENFORCE(port_base + k <= 65535, InvalidArgumentError, "SlurmClusterResolver: port ", port_base + k,
                       " of task ", k, " on ", nodes[n], " is out of range");
      addresses.push_back(nodes[n] + ":" + std::to_string(port_base + k));
    }
  }
  MIRRORED_ENFORCE(static_cast<int>(addresses.size()) == num_tasks, InvalidArgumentError,
                   "SlurmClusterResolver: the nodes hold ", addresses.size(), " tasks but the step has ", num_tasks);
  MIRRORED_ENFORCE(rank >= 0 && rank < num_tasks, InvalidArgumentError, "SlurmClusterResolver: SLURM_PROCID ", rank,
                   " is out of range for ", num_tasks, " tasks");
  // This task's place on its node, in the blocks the addresses above deal to the nodes.
  std::size_t node = 0;
  int first_of_node = 0;
  while (rank >= first_of_node + per_node[node]) first_of_node += per_node[node++];
  const int local_rank = rank - first_of_node;
  std::string local_source = str_cat("Slurm's SLURM_PROCID=", rank);
  if (const char* text = std::getenv("SLURM_LOCALID"); text && *text) {
    const int localid = detail::parse_count(text, "SLURM_LOCALID");
    MIRRORED_ENFORCE(localid == local_rank, InvalidArgumentError, "SlurmClusterResolver: SLURM_LOCALID=", localid,
                     " but task SLURM_PROCID=", rank, " is task ", local_rank, " of ", nodes[node], " in ", used, " ('",
                     per_node_text,
                     "'): the step's tasks are not dealt to its nodes in blocks, as the cluster spec (TF's) deals "
                     "them, so this task would get another's address; run the step with srun --distribution=block");
    local_source = str_cat("Slurm's SLURM_LOCALID=", localid);
  }
  local_ = {local_rank, per_node[node], 0, str_cat(local_source, ", ", used, "=", per_node_text)};
  if (const char* text = std::getenv("SLURM_GPUS_PER_TASK"); text && *text) {
    local_.gpus_per_worker = slurm_gpus_per_task(text);
    local_.source += str_cat(", SLURM_GPUS_PER_TASK=", text);
  }
  if (jobs.empty()) jobs["worker"] = num_tasks;
  // Tasks are dealt in rank order: the chief first, then the workers, then other jobs by name.
  std::vector<std::pair<std::string, int>> order;
  for (const char* first : {"chief", "worker"})
    if (auto it = jobs.find(first); it != jobs.end()) order.emplace_back(*it);
  for (const auto& [job, n] : jobs)
    if (job != "chief" && job != "worker") order.emplace_back(job, n);
  int64_t total = 0;
  for (const auto& [job, n] : order) {
    MIRRORED_ENFORCE(n >= 0, InvalidArgumentError, "SlurmClusterResolver: job \"", job, "\" has ", n, " tasks");
    total += n;
  }
  MIRRORED_ENFORCE(total == num_tasks, InvalidArgumentError, "SlurmClusterResolver: `jobs` asks for ", total,
                   " tasks but the step has ", num_tasks);
  std::size_t next = 0;
  for (const auto& [job, n] : order) {
    auto& tasks = cluster_.jobs[job];
    for (int i = 0; i < n; ++i, ++next) {
      if (static_cast<int>(next) == rank) {
        task_type_ = job;
        task_id_ = i;
      }
      tasks.push_back(addresses[next]);
    }
  }
}

}  // namespace mirrored
