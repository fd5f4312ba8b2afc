// TF_CONFIG, the cluster resolvers and TF's rules for a multi-worker cluster.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <mirrored/mirrored.hpp>

#include "cluster/resolvers/tf_config.hpp"
#include "cluster/scoped_env.hpp"

namespace mirrored {
namespace {

using detail::cluster::parse_tf_config;
using detail::cluster::resolve_layout;
using ::testing::HasSubstr;

template <class E = InvalidArgumentError, class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

using testing::ScopedEnv;

ClusterSpec spec(std::map<std::string, std::vector<std::string>> jobs) { return ClusterSpec{std::move(jobs)}; }

TEST(TfConfig, ParsesClusterTaskAndRpcLayer) {
  const auto c = parse_tf_config(R"({"cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"]},
                                     "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc",
                                     "environment": "cloud"})");
  EXPECT_EQ(c.cluster.jobs.at("worker"), (std::vector<std::string>{"w0:2", "w1:3"}));
  EXPECT_EQ(c.cluster.task_address("chief", 0), "c:1");
  EXPECT_EQ(c.task_type, "worker");
  EXPECT_EQ(c.task_id, 1);
  EXPECT_EQ(c.rpc_layer, "grpc");
  // TF converts the index with int(): a string of digits is accepted.
  EXPECT_EQ(parse_tf_config(R"({"task": {"type": "worker", "index": "2"}})").task_id, 2);
  EXPECT_TRUE(parse_tf_config("").cluster.empty());
  EXPECT_TRUE(parse_tf_config("  \n").cluster.empty());
  EXPECT_FALSE(parse_tf_config("{}").task_type.has_value());
}

TEST(TfConfig, MalformedValuesNameTheKey) {
  EXPECT_THAT(error_of([] { parse_tf_config("{\"cluster\": "); }), HasSubstr("TF_CONFIG is not valid JSON"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": {"index": 0}, "task": {"index": 1}})"); }),
              HasSubstr("duplicate key \"task\""));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"cluster": {"chief": ["a:1"], "chief": ["b:2"]}})"); }),
              HasSubstr("duplicate key \"chief\" in the object at cluster"));
  EXPECT_THAT(error_of([] { parse_tf_config("[1]"); }), HasSubstr("TF_CONFIG must be a JSON object"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"cluster": ["a:1"]})"); }), HasSubstr("TF_CONFIG: cluster must be"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"cluster": {"worker": "a:1"}})"); }),
              HasSubstr("cluster.worker must be a list"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"cluster": {"worker": ["a:1", 7]}})"); }),
              HasSubstr("cluster.worker[1] must be a \"host:port\" string, got a number"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": []})"); }), HasSubstr("TF_CONFIG: task must be an object"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": {"type": 1}})"); }), HasSubstr("task.type must be a string"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": {"index": -1}})"); }),
              HasSubstr("task.index must be a non-negative integer, got -1"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": {"index": 1.5}})"); }), HasSubstr("got 1.5"));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"task": {"index": "x"}})"); }), HasSubstr("got \"x\""));
  EXPECT_THAT(error_of([] { parse_tf_config(R"({"rpc_layer": 3})"); }), HasSubstr("rpc_layer must be a string"));
}

TEST(ClusterRules, RanksPutTheChiefFirstThenTheWorkers) {
  const auto s = spec({{"chief", {"c:1"}}, {"worker", {"w0:2", "w1:3"}}, {"ps", {"p:4"}}});
  const auto chief = resolve_layout(s, "chief", 0, "TF_CONFIG");
  EXPECT_EQ(chief.num_workers, 3);
  EXPECT_EQ(chief.rank, 0);
  EXPECT_TRUE(chief.is_chief());
  EXPECT_EQ(chief.addresses, (std::vector<std::string>{"c:1", "w0:2", "w1:3"}));
  EXPECT_EQ(chief.names[2], "worker 1 (w1:3)");
  const auto w1 = resolve_layout(s, "worker", 1, "TF_CONFIG");
  EXPECT_EQ(w1.rank, 2);
  EXPECT_FALSE(w1.is_chief());
}

TEST(ClusterRules, WorkerZeroIsTheChiefWithoutAChiefJob) {
  const auto s = spec({{"worker", {"w0:2", "w1:3"}}});
  EXPECT_TRUE(resolve_layout(s, "worker", 0, "TF_CONFIG").is_chief());
  EXPECT_EQ(resolve_layout(s, "worker", 1, "TF_CONFIG").rank, 1);
}

TEST(ClusterRules, AnEmptyClusterIsOneLocalWorker) {
  const auto layout = resolve_layout(ClusterSpec{}, "", 0, "TF_CONFIG");
  EXPECT_EQ(layout.num_workers, 1);
  EXPECT_EQ(layout.rank, 0);
  EXPECT_TRUE(layout.addresses.empty());
}

TEST(ClusterRules, ViolationsNameTheKey) {
  const auto two = spec({{"worker", {"a:1", "b:2"}}});
  EXPECT_THAT(error_of([&] { resolve_layout(two, "worker", 2, "TF_CONFIG"); }),
              HasSubstr("TF_CONFIG: task.index 2 is out of range: cluster.worker has 2 tasks"));
  EXPECT_THAT(error_of([&] { resolve_layout(two, "worker", -1, "TF_CONFIG"); }), HasSubstr("task.index -1"));
  EXPECT_THAT(error_of([] {
                resolve_layout(spec({{"chief", {"a:1", "b:2"}}}), "chief", 0, "TF_CONFIG");
              }),
              HasSubstr("cluster.chief has 2 tasks; there must be at most one chief"));
  EXPECT_THAT(error_of([] {
                resolve_layout(spec({{"worker", {"a:1"}}, {"evaluator", {"e:1", "e:2"}}}), "worker", 0, "TF_CONFIG");
              }),
              HasSubstr("at most one evaluator"));
  EXPECT_THAT(error_of([] {
                resolve_layout(spec({{"trainer", {"a:1"}}}), "trainer", 0, "TF_CONFIG");
              }),
              HasSubstr("unknown job \"trainer\""));
  EXPECT_THAT(error_of([&] { resolve_layout(two, "master", 0, "TF_CONFIG"); }),
              HasSubstr("task.type \"master\" is not a job of a multi-worker cluster"));
  EXPECT_THAT(error_of([&] { resolve_layout(two, "", 0, "TF_CONFIG"); }), HasSubstr("task.type is missing"));
  EXPECT_THAT(error_of([&] { resolve_layout(two, "chief", 0, "TF_CONFIG"); }),
              HasSubstr("task.type \"chief\" has no tasks in the cluster"));
  EXPECT_THAT(error_of([] {
                resolve_layout(spec({{"worker", {"no-port"}}}), "worker", 0, "TF_CONFIG");
              }),
              HasSubstr("cluster.worker[0]: address 'no-port' is not of the form host:port"));
  EXPECT_THAT(error_of([] {
                resolve_layout(spec({{"worker", {"a:70000"}}}), "worker", 0, "TF_CONFIG");
              }),
              HasSubstr("no valid port"));
}

TEST(ClusterRules, PsAndEvaluatorTasksCannotJoin) {
  const auto s = spec({{"worker", {"a:1"}}, {"ps", {"p:1"}}, {"evaluator", {"e:1"}}});
  EXPECT_THAT(error_of([&] { resolve_layout(s, "ps", 0, "TF_CONFIG"); }),
              HasSubstr("a \"ps\" task cannot join MultiWorkerMirroredStrategy"));
  EXPECT_THAT(error_of([&] { resolve_layout(s, "evaluator", 0, "TF_CONFIG"); }),
              HasSubstr("a \"evaluator\" task cannot join"));
}

TEST(Resolvers, TfConfigResolverReadsTheEnvironmentAndArgumentsOverrideIt) {
  ScopedEnv env("TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1},
                                 "rpc_layer": "grpc"})");
  TFConfigClusterResolver r;
  EXPECT_EQ(r.cluster_spec().num_tasks("worker"), 2);
  EXPECT_EQ(r.task_type(), "worker");
  EXPECT_EQ(r.task_id(), 1);
  EXPECT_EQ(r.rpc_layer(), "grpc");
  TFConfigClusterResolver o("chief", 0, "");
  EXPECT_EQ(o.task_type(), "chief");
  EXPECT_EQ(o.task_id(), 0);
  EXPECT_EQ(o.rpc_layer(), "");
}

TEST(Resolvers, NoTfConfigIsAnEmptyCluster) {
  ScopedEnv env("TF_CONFIG", nullptr);
  TFConfigClusterResolver r;
  EXPECT_TRUE(r.cluster_spec().empty());
  EXPECT_EQ(r.task_type(), "");
}

TEST(Resolvers, SimpleResolverAndClusterSpecAccessors) {
  SimpleClusterResolver r(spec({{"worker", {"a:1", "b:2"}}}), "worker", 1, "grpc");
  EXPECT_EQ(r.task_id(), 1);
  EXPECT_EQ(r.rpc_layer(), "grpc");
  const ClusterSpec c = r.cluster_spec();
  EXPECT_EQ(c.job_tasks("worker")[1], "b:2");
  EXPECT_EQ(c.num_tasks("ps"), 0);
  EXPECT_THAT(error_of([&] { c.job_tasks("ps"); }), HasSubstr("no job \"ps\""));
  EXPECT_THAT(error_of([&] { c.task_address("worker", 2); }), HasSubstr("task index 2 is out of range"));
}

TEST(Resolvers, SlurmHostListsAndTasksPerNodeExpand) {
  using detail::expand_slurm_hostlist;
  using detail::expand_slurm_tasks_per_node;
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,7],gpu", "V"),
            (std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]n[1-2]", "V"), (std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"}));
  EXPECT_EQ(expand_slurm_tasks_per_node("2(x3),1", "V"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_THAT(error_of([] { expand_slurm_hostlist("node[1-", "SLURM_STEP_NODELIST"); }),
              HasSubstr("SLURM_STEP_NODELIST has unbalanced brackets"));
  EXPECT_THAT(error_of([] { expand_slurm_hostlist("n[3-1]", "V"); }), HasSubstr("bad range"));
  EXPECT_THAT(error_of([] { expand_slurm_tasks_per_node("2(x", "V"); }), HasSubstr("malformed"));
}

TEST(Resolvers, SlurmResolverDealsTasksInRankOrder) {
  ScopedEnv a("SLURM_PROCID", "3");
  ScopedEnv b("SLURM_STEP_NUM_TASKS", "4");
  ScopedEnv c("SLURM_STEP_NODELIST", "n[1-2]");
  ScopedEnv d("SLURM_STEP_TASKS_PER_NODE", "2(x2)");
  ScopedEnv e("SLURM_LOCALID", nullptr);  // this process may itself run in a Slurm step
  SlurmClusterResolver all;
  EXPECT_EQ(all.cluster_spec().job_tasks("worker"),
            (std::vector<std::string>{"n1:8888", "n1:8889", "n2:8888", "n2:8889"}));
  EXPECT_EQ(all.task_type(), "worker");
  EXPECT_EQ(all.task_id(), 3);
  SlurmClusterResolver split({{"chief", 1}, {"worker", 3}}, 2222);
  EXPECT_EQ(split.cluster_spec().job_tasks("chief"), (std::vector<std::string>{"n1:2222"}));
  EXPECT_EQ(split.task_type(), "worker");
  EXPECT_EQ(split.task_id(), 2);
  EXPECT_THAT(error_of([] {
                SlurmClusterResolver({{"worker", 3}});
              }),
              HasSubstr("asks for 3 tasks but the step has 4"));
  ScopedEnv gone("SLURM_PROCID", nullptr);
  EXPECT_THAT(error_of([] { SlurmClusterResolver(); }), HasSubstr("SLURM_PROCID is not set"));
}

TEST(MultiWorkerStrategy, WithoutTfConfigItIsOneLocalWorker) {
  ScopedEnv env("TF_CONFIG", nullptr);
  MultiWorkerMirroredStrategy s(CommunicationOptions{}, nullptr, {"CPU:0", "CPU:1"});
  EXPECT_EQ(s.num_replicas_in_sync(), 2);
  EXPECT_EQ(s.extended().num_workers(), 1);
  EXPECT_TRUE(s.extended().should_checkpoint());
  EXPECT_TRUE(s.extended().should_save_summary());
  EXPECT_EQ(s.cluster_resolver().task_type(), "");
  EXPECT_EQ(s.cluster_resolver().local_placement(), LocalPlacement{});  // TF_CONFIG says nothing of machines
  EXPECT_EQ(SimpleClusterResolver(spec({{"worker", {"a:1", "a:2"}}}), "worker", 1).local_placement(),
            (LocalPlacement{0, 1, 0, ""}));
  auto out = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 2.0f); });
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(s.reduce(ReduceOp::SUM, out, std::nullopt), 8.0f);
}

TEST(MultiWorkerStrategy, BadTfConfigFailsConstructionNamingTheKey) {
  {
    ScopedEnv env("TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 5}})");
    EXPECT_THAT(error_of([] { MultiWorkerMirroredStrategy s; }), HasSubstr("TF_CONFIG: task.index 5 is out of range"));
  }
  {
    ScopedEnv env("TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0})");
    EXPECT_THAT(error_of([] { MultiWorkerMirroredStrategy s; }), HasSubstr("TF_CONFIG is not valid JSON"));
  }
  {
    ScopedEnv env("TF_CONFIG", R"({"cluster": {"chief": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "chief"}})");
    EXPECT_THAT(error_of([] { MultiWorkerMirroredStrategy s; }), HasSubstr("at most one chief"));
  }
  {
    ScopedEnv env("TF_CONFIG", R"({"cluster": {"boss": ["127.0.0.1:1"]}, "task": {"type": "boss"}})");
    EXPECT_THAT(error_of([] { MultiWorkerMirroredStrategy s; }), HasSubstr("unknown job \"boss\""));
  }
  auto ps =
      std::make_shared<SimpleClusterResolver>(spec({{"worker", {"127.0.0.1:1"}}, {"ps", {"127.0.0.1:2"}}}), "ps", 0);
  EXPECT_THAT(error_of([&] { MultiWorkerMirroredStrategy s(CommunicationOptions{}, ps); }),
              HasSubstr("the cluster resolver: task.type \"ps\": a \"ps\" task cannot join"));
  CommunicationOptions nccl;
  nccl.implementation = CommunicationImplementation::NCCL;
  EXPECT_THAT(error_of([&] { MultiWorkerMirroredStrategy s(nccl, nullptr, {"CPU:0"}); }),
              HasSubstr("NCCL needs GPU replicas"));
  EXPECT_THAT(error_of([&] {
                MultiWorkerMirroredStrategy s(CommunicationOptions{}, nullptr, {"CPU:0", "/cpu:0"});
              }),
              HasSubstr("No duplicates allowed"));
}

}  // namespace
}  // namespace mirrored
