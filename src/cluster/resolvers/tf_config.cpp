#include "cluster/resolvers/tf_config.hpp"

#include <algorithm>
#include <limits>

#include "cluster/net/socket.hpp"
#include "mirrored/errors.hpp"
#include "util/json.hpp"

namespace mirrored::detail::cluster {
namespace {

const char* const kJobs[] = {"chief", "worker", "evaluator", "ps"};

bool known_job(const std::string& job) { return std::find(std::begin(kJobs), std::end(kJobs), job) != std::end(kJobs); }

int parse_index(const json::Value& v) {
  // TF converts the index with int(), which also accepts a string of digits.
  if (v.is_number()) {
    const auto i = v.as_int64();
    MIRRORED_ENFORCE(i && *i >= 0 && *i <= std::numeric_limits<int>::max(), InvalidArgumentError,
                     "TF_CONFIG: task.index must be a non-negative integer, got ", v.number_text());
    return static_cast<int>(*i);
  }
  if (v.is_string()) {
    const std::string& s = v.as_string();
    const bool digits =
        !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    MIRRORED_ENFORCE(digits, InvalidArgumentError, "TF_CONFIG: task.index must be a non-negative integer, got \"", s,
                     "\"");
    return std::stoi(s);
  }
  throw InvalidArgumentError(str_cat("TF_CONFIG: task.index must be a non-negative integer, got a ", v.kind_name()));
}

}  // namespace

TfConfig parse_tf_config(std::string_view text) {
  TfConfig out;
  if (std::all_of(text.begin(), text.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }))
    return out;
  const json::Value root = json::parse(text, "TF_CONFIG");
  MIRRORED_ENFORCE(root.is_object(), InvalidArgumentError, "TF_CONFIG must be a JSON object, got a ", root.kind_name());
  if (const json::Value* cluster = root.find("cluster")) {
    MIRRORED_ENFORCE(cluster->is_object(), InvalidArgumentError,
                     "TF_CONFIG: cluster must be an object of job names to lists of \"host:port\" strings, got a ",
                     cluster->kind_name());
    for (const auto& [job, tasks] : cluster->members()) {
      MIRRORED_ENFORCE(tasks.is_array(), InvalidArgumentError, "TF_CONFIG: cluster.", job,
                       " must be a list of \"host:port\" strings, got a ", tasks.kind_name());
      auto& addresses = out.cluster.jobs[job];
      for (std::size_t i = 0; i < tasks.items().size(); ++i) {
        const json::Value& a = tasks.items()[i];
        MIRRORED_ENFORCE(a.is_string(), InvalidArgumentError, "TF_CONFIG: cluster.", job, "[", i,
                         "] must be a \"host:port\" string, got a ", a.kind_name());
        addresses.push_back(a.as_string());
      }
    }
  }
  if (const json::Value* task = root.find("task")) {
    MIRRORED_ENFORCE(task->is_object(), InvalidArgumentError,
                     "TF_CONFIG: task must be an object {\"type\": …, \"index\": …}, got a ", task->kind_name());
    if (const json::Value* type = task->find("type")) {
      MIRRORED_ENFORCE(type->is_string(), InvalidArgumentError, "TF_CONFIG: task.type must be a string, got a ",
                       type->kind_name());
      out.task_type = type->as_string();
    }
    if (const json::Value* index = task->find("index")) out.task_id = parse_index(*index);
  }
  if (const json::Value* rpc = root.find("rpc_layer")) {
    MIRRORED_ENFORCE(rpc->is_string(), InvalidArgumentError, "TF_CONFIG: rpc_layer must be a string, got a ",
                     rpc->kind_name());
    out.rpc_layer = rpc->as_string();
  }
  return out;
}

ClusterLayout resolve_layout(const ClusterSpec& cluster, const std::string& task_type, int task_id,
                             const std::string& source) {
  ClusterLayout layout;
  layout.task_type = task_type.empty() ? "worker" : task_type;
  layout.task_id = task_id;
  bool any_tasks = false;
  for (const auto& [job, tasks] : cluster.jobs) any_tasks = any_tasks || !tasks.empty();
  if (!any_tasks) return layout;  // no cluster: one local worker

  for (const auto& [job, tasks] : cluster.jobs) {
    MIRRORED_ENFORCE(known_job(job), InvalidArgumentError, source, ": cluster has an unknown job \"", job,
                     "\": the jobs of a multi-worker cluster are \"chief\", \"worker\", \"evaluator\" and \"ps\"");
    for (std::size_t i = 0; i < tasks.size(); ++i)
      if (!tasks[i].empty()) net::split_host_port(tasks[i], str_cat(source, ": cluster.", job, "[", i, "]"));
  }
  const int chiefs = cluster.num_tasks("chief");
  MIRRORED_ENFORCE(chiefs <= 1, InvalidArgumentError, source, ": cluster.chief has ", chiefs,
                   " tasks; there must be at most one chief");
  const int evaluators = cluster.num_tasks("evaluator");
  MIRRORED_ENFORCE(evaluators <= 1, InvalidArgumentError, source, ": cluster.evaluator has ", evaluators,
                   " tasks; there must be at most one evaluator");
  MIRRORED_ENFORCE(!task_type.empty(), InvalidArgumentError, source,
                   ": task.type is missing; it must name this task's job (\"chief\" or \"worker\")");
  MIRRORED_ENFORCE(known_job(task_type), InvalidArgumentError, source, ": task.type \"", task_type,
                   "\" is not a job of a multi-worker cluster (\"chief\", \"worker\", \"evaluator\" or \"ps\")");
  MIRRORED_ENFORCE(task_type == "chief" || task_type == "worker", InvalidArgumentError, source, ": task.type \"",
                   task_type, "\": a \"", task_type,
                   "\" task cannot join MultiWorkerMirroredStrategy; only \"chief\" and \"worker\" tasks take part in "
                   "its collectives");
  const int of_type = cluster.num_tasks(task_type);
  MIRRORED_ENFORCE(of_type > 0, InvalidArgumentError, source, ": task.type \"", task_type,
                   "\" has no tasks in the cluster (cluster.", task_type, " is missing)");
  MIRRORED_ENFORCE(task_id >= 0 && task_id < of_type, InvalidArgumentError, source, ": task.index ", task_id,
                   " is out of range: cluster.", task_type, " has ", of_type, of_type == 1 ? " task" : " tasks");

  for (const char* job : {"chief", "worker"}) {
    const int n = cluster.num_tasks(job);
    for (int i = 0; i < n; ++i) {
      const std::string address = cluster.task_address(job, i);
      layout.addresses.push_back(address);
      layout.names.push_back(address.empty() ? str_cat(job, " ", i) : str_cat(job, " ", i, " (", address, ")"));
    }
  }
  const char* chief_job = chiefs > 0 ? "chief" : "worker";
  MIRRORED_ENFORCE(!layout.addresses.empty() && !layout.addresses[0].empty(), InvalidArgumentError, source,
                   ": cluster.", chief_job,
                   "[0], the chief, has no address; it serves the job's store there, so it "
                   "must be host:port");
  layout.num_workers = static_cast<int>(layout.addresses.size());
  layout.rank = task_type == "chief" ? 0 : chiefs + task_id;
  return layout;
}

std::string ClusterLayout::own_host() const {
  const std::string& mine = addresses.at(static_cast<std::size_t>(rank));
  if (!mine.empty()) return net::split_host_port(mine, names[static_cast<std::size_t>(rank)]).first;
  const auto [host, port] = net::split_host_port(addresses.at(0), names.at(0));
  return net::local_address_towards(host, port);
}

}  // namespace mirrored::detail::cluster
