// The launchers' resolvers (torchrun, MPI, Slurm) and cluster_resolver_from_environment: every
// variable set each reads, the order in which the environment picks one, and the partial and
// inconsistent sets, each an InvalidArgumentError naming the variables.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "cluster/process_harness.hpp"
#include "cluster/resolvers/tf_config.hpp"
#include "cluster/scoped_env.hpp"
#include "gtest_util.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using Vars = std::map<std::string, std::string>;

// Every variable a resolver reads: each case starts with none of them set.
const std::vector<std::string> kLauncherVariables{"TF_CONFIG",
                                                  "RANK",
                                                  "WORLD_SIZE",
                                                  "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE",
                                                  "MASTER_ADDR",
                                                  "MASTER_PORT",
                                                  "MIRRORED_MASTER_ADDR",
                                                  "MIRRORED_MASTER_PORT",
                                                  "TORCHELASTIC_RESTART_COUNT",
                                                  "OMPI_COMM_WORLD_RANK",
                                                  "OMPI_COMM_WORLD_SIZE",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                  "PMIX_RANK",
                                                  "PMI_RANK",
                                                  "PMI_SIZE",
                                                  "MPI_LOCALRANKID",
                                                  "MPI_LOCALNRANKS",
                                                  "SLURM_PROCID",
                                                  "SLURM_STEP_ID",
                                                  "SLURM_STEP_NUM_TASKS",
                                                  "SLURM_NTASKS",
                                                  "SLURM_STEP_NODELIST",
                                                  "SLURM_JOB_NODELIST",
                                                  "SLURM_STEP_TASKS_PER_NODE",
                                                  "SLURM_TASKS_PER_NODE",
                                                  "SLURM_LOCALID",
                                                  "SLURM_GPUS_PER_TASK",
                                                  "MIRRORED_SLURM_PORT_BASE"};

testing::ScopedEnvironment only(const Vars& vars) { return testing::ScopedEnvironment(kLauncherVariables, vars); }

template <class Resolver>
std::string launcher_error(const Vars& vars) {
  auto env = only(vars);
  return testing::error_of<InvalidArgumentError>([] { Resolver r; });
}

// `base` with `changes` made: a variable changed to "" is removed.
Vars changed(Vars base, const Vars& changes) {
  for (const auto& [k, v] : changes) {
    if (v.empty())
      base.erase(k);
    else
      base[k] = v;
  }
  return base;
}

ClusterSpec workers(std::vector<std::string> addresses) { return ClusterSpec{{{"worker", std::move(addresses)}}}; }

const Vars kTorchrun{{"RANK", "1"},
                     {"WORLD_SIZE", "3"},
                     {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "3"},
                     {"MASTER_ADDR", "node0"},
                     {"MASTER_PORT", "29500"},
                     {"TORCHELASTIC_RESTART_COUNT", "2"}};

TEST(TorchrunResolver, ReadsTorchrunsVariables) {
  auto env = only(kTorchrun);
  TorchrunClusterResolver r;
  EXPECT_EQ(r.cluster_spec(), workers({"node0:29500", "", ""}));
  EXPECT_EQ(r.task_type(), "worker");
  EXPECT_EQ(r.task_id(), 1);
  EXPECT_EQ(r.local_rank(), 1);
  EXPECT_EQ(r.local_world_size(), 3);
  EXPECT_EQ(r.restart_count(), 2);
  EXPECT_EQ(r.rpc_layer(), "");
  EXPECT_EQ(r.source(), "torchrun's variables (RANK=1, WORLD_SIZE=3, MASTER_ADDR=node0, MASTER_PORT=29500)");
  EXPECT_EQ(r.local_placement(), (LocalPlacement{1, 3, 0, "torchrun's LOCAL_RANK=1, LOCAL_WORLD_SIZE=3"}));
}

TEST(TorchrunResolver, ALocalRankWithoutTheLocalSizeLeavesTheDefaultPlace) {
  // torch.distributed.launch before torchrun set LOCAL_RANK only: how many share the machine is unknown.
  auto env = only(changed(kTorchrun, {{"LOCAL_WORLD_SIZE", ""}}));
  TorchrunClusterResolver r;
  EXPECT_EQ(r.local_rank(), 1);
  EXPECT_EQ(r.local_placement(), LocalPlacement{});
}

TEST(TorchrunResolver, TheMirroredVariablesTakeThePlaceOfMasterAddrAndPort) {
  Vars vars = kTorchrun;
  vars["MIRRORED_MASTER_ADDR"] = "10.0.0.7";
  vars["MIRRORED_MASTER_PORT"] = "4000";
  {
    auto env = only(vars);
    TorchrunClusterResolver r;
    EXPECT_EQ(r.cluster_spec(), workers({"10.0.0.7:4000", "", ""}));
    EXPECT_THAT(r.source(), HasSubstr("MIRRORED_MASTER_ADDR=10.0.0.7, MIRRORED_MASTER_PORT=4000)"));
  }
  vars["MIRRORED_MASTER_ADDR"] = "fd00::7";  // an IPv6 host is bracketed
  auto env = only(vars);
  EXPECT_EQ(TorchrunClusterResolver().cluster_spec(), workers({"[fd00::7]:4000", "", ""}));
}

TEST(TorchrunResolver, OneWorkerNeedsNoAddressAndTheLocalVariablesAreOptional) {
  auto env = only({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  TorchrunClusterResolver r;
  EXPECT_TRUE(r.cluster_spec().empty());
  EXPECT_EQ(r.task_id(), 0);
  EXPECT_EQ(r.local_rank(), 0);
  EXPECT_EQ(r.local_world_size(), 1);
  EXPECT_EQ(r.restart_count(), 0);
  EXPECT_EQ(r.local_placement(), LocalPlacement{});
}

TEST(TorchrunResolver, PartialOrInconsistentVariablesNameThem) {
  const std::string who = "TorchrunClusterResolver: ";
  auto with = [](const Vars& changes) { return launcher_error<TorchrunClusterResolver>(changed(kTorchrun, changes)); };
  EXPECT_THAT(with({{"RANK", ""}}),
              HasSubstr(who + "RANK is not set (WORLD_SIZE=3, LOCAL_RANK=1, LOCAL_WORLD_SIZE=3)"));
  EXPECT_THAT(with({{"WORLD_SIZE", ""}}), HasSubstr(who + "WORLD_SIZE is not set (RANK=1, LOCAL_RANK=1"));
  EXPECT_EQ(
      with({{"RANK", "3"}}),
      who + "the rank must be below the number of workers (RANK=3, WORLD_SIZE=3, LOCAL_RANK=1, LOCAL_WORLD_SIZE=3)");
  EXPECT_THAT(with({{"WORLD_SIZE", "0"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}}),
              HasSubstr(who + "the number of workers must be at least 1 (RANK=0, WORLD_SIZE=0"));
  EXPECT_THAT(with({{"RANK", "-1"}}), HasSubstr(who + "RANK='-1' is not a non-negative whole number"));
  EXPECT_THAT(with({{"WORLD_SIZE", "2x"}}), HasSubstr(who + "WORLD_SIZE='2x' is not a non-negative whole number"));
  EXPECT_THAT(with({{"LOCAL_RANK", "3"}, {"RANK", "2"}, {"WORLD_SIZE", "4"}}),
              HasSubstr(who + "the local rank must be below the number of workers on this machine (RANK=2, "
                              "WORLD_SIZE=4, LOCAL_RANK=3, LOCAL_WORLD_SIZE=3)"));
  EXPECT_THAT(with({{"LOCAL_WORLD_SIZE", "4"}}),
              HasSubstr(who + "the number of workers on this machine must be from 1 to the number of workers"));
  EXPECT_THAT(with({{"RANK", "0"}}), HasSubstr(who + "the local rank cannot exceed the rank"));
  EXPECT_THAT(with({{"MASTER_ADDR", ""}}),
              HasSubstr(who + "MASTER_ADDR is not set (nor MIRRORED_MASTER_ADDR and MIRRORED_MASTER_PORT, which take "
                              "their place)"));
  EXPECT_THAT(with({{"MASTER_ADDR", ""}}), HasSubstr("(set: MASTER_PORT=29500)"));
  EXPECT_THAT(with({{"MASTER_PORT", ""}}), HasSubstr(who + "MASTER_PORT is not set"));
  EXPECT_THAT(with({{"MASTER_PORT", ""}, {"MASTER_ADDR", ""}}),
              HasSubstr(who + "MASTER_ADDR and MASTER_PORT are not set"));
  for (const char* port : {"0", "65536", "http"})
    EXPECT_THAT(with({{"MASTER_PORT", port}}),
                HasSubstr(who + "MASTER_PORT='" + port + "' is not a port (a whole number from 1 to 65535)"));
  EXPECT_THAT(with({{"MIRRORED_MASTER_PORT", "99999"}}), HasSubstr(who + "MIRRORED_MASTER_PORT='99999' is not a port"));
  EXPECT_THAT(with({{"TORCHELASTIC_RESTART_COUNT", "one"}}),
              HasSubstr(who + "TORCHELASTIC_RESTART_COUNT='one' is not a non-negative whole number"));
}

const Vars kOpenMpi{{"OMPI_COMM_WORLD_RANK", "1"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                    {"PMIX_RANK", "1"},
                    {"MASTER_ADDR", "head"},
                    {"MASTER_PORT", "29500"}};

TEST(MpiResolver, ReadsOpenMpisVariables) {
  auto env = only(kOpenMpi);
  MPIClusterResolver r;
  EXPECT_EQ(r.cluster_spec(), workers({"head:29500", "", "", ""}));
  EXPECT_EQ(r.task_type(), "worker");
  EXPECT_EQ(r.task_id(), 1);
  EXPECT_EQ(r.local_rank(), 1);
  EXPECT_EQ(r.local_size(), 2);
  EXPECT_EQ(r.local_placement(),
            (LocalPlacement{1, 2, 0, "MPI's OMPI_COMM_WORLD_LOCAL_RANK=1, OMPI_COMM_WORLD_LOCAL_SIZE=2"}));
  EXPECT_EQ(r.source(),
            "MPI's variables (OMPI_COMM_WORLD_RANK=1, PMIX_RANK=1, OMPI_COMM_WORLD_SIZE=4, MASTER_ADDR=head, "
            "MASTER_PORT=29500)");
}

TEST(MpiResolver, ReadsHydrasVariables) {
  auto env = only({{"PMI_RANK", "2"},
                   {"PMI_SIZE", "3"},
                   {"MPI_LOCALRANKID", "1"},
                   {"MPI_LOCALNRANKS", "2"},
                   {"MIRRORED_MASTER_ADDR", "10.1.1.1"},
                   {"MIRRORED_MASTER_PORT", "7000"}});
  MPIClusterResolver r;
  EXPECT_EQ(r.cluster_spec(), workers({"10.1.1.1:7000", "", ""}));
  EXPECT_EQ(r.task_id(), 2);
  EXPECT_EQ(r.local_rank(), 1);
  EXPECT_EQ(r.local_size(), 2);
  EXPECT_EQ(r.local_placement(), (LocalPlacement{1, 2, 0, "MPI's MPI_LOCALRANKID=1, MPI_LOCALNRANKS=2"}));
  EXPECT_EQ(r.source(),
            "MPI's variables (PMI_RANK=2, PMI_SIZE=3, MIRRORED_MASTER_ADDR=10.1.1.1, MIRRORED_MASTER_PORT=7000)");
}

TEST(MpiResolver, PartialOrInconsistentVariablesNameThem) {
  const std::string who = "MPIClusterResolver: ";
  auto with = [](const Vars& changes) { return launcher_error<MPIClusterResolver>(changed(kOpenMpi, changes)); };
  EXPECT_EQ(launcher_error<MPIClusterResolver>({}),
            who +
                "OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK is not set: a worker needs both its rank and the "
                "number of workers");
  EXPECT_THAT(launcher_error<MPIClusterResolver>({{"PMIX_RANK", "0"}}),
              HasSubstr(who + "OMPI_COMM_WORLD_SIZE or PMI_SIZE is not set (PMIX_RANK=0)"));
  EXPECT_EQ(with({{"PMIX_RANK", "0"}}), who +
                                            "OMPI_COMM_WORLD_RANK=1 and PMIX_RANK=0 disagree: the launcher's "
                                            "variables must name the same number");
  EXPECT_THAT(with({{"PMI_RANK", "3"}}), HasSubstr(who + "OMPI_COMM_WORLD_RANK=1 and PMI_RANK=3 disagree"));
  EXPECT_THAT(with({{"PMI_SIZE", "5"}}), HasSubstr(who + "OMPI_COMM_WORLD_SIZE=4 and PMI_SIZE=5 disagree"));
  EXPECT_THAT(with({{"MPI_LOCALRANKID", "0"}}),
              HasSubstr(who + "OMPI_COMM_WORLD_LOCAL_RANK=1 and MPI_LOCALRANKID=0 disagree"));
  EXPECT_THAT(with({{"OMPI_COMM_WORLD_RANK", "4"}, {"PMIX_RANK", "4"}}),
              HasSubstr(who + "the rank must be below the number of workers (OMPI_COMM_WORLD_RANK=4, PMIX_RANK=4, "
                              "OMPI_COMM_WORLD_SIZE=4"));
  EXPECT_THAT(with({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"PMIX_RANK", "3"}}),
              HasSubstr(who + "the local rank must be below the number of workers on this machine"));
  EXPECT_THAT(with({{"MASTER_ADDR", ""}, {"MASTER_PORT", ""}}),
              HasSubstr(who + "MASTER_ADDR and MASTER_PORT are not set"));
  EXPECT_THAT(with({{"OMPI_COMM_WORLD_SIZE", "four"}}),
              HasSubstr(who + "OMPI_COMM_WORLD_SIZE='four' is not a non-negative whole number"));
}

// cluster_resolver_from_environment: which resolver each launcher's variables get, and its INFO line.
struct Picked {
  std::shared_ptr<ClusterResolver> resolver;
  std::string log;
};

Picked pick(const Vars& vars) {
  auto env = only(vars);
  static std::mutex mu;
  static std::string lines;
  {
    std::lock_guard lock(mu);
    lines.clear();
  }
  set_log_sink([](LogLevel level, std::string_view message) {
    std::lock_guard lock(mu);
    if (level == LogLevel::info) lines += std::string(message) + "\n";
  });
  set_log_level(LogLevel::info);
  Picked out;
  try {
    out.resolver = cluster_resolver_from_environment();
  } catch (...) {
    set_log_level(LogLevel::warn);
    set_log_sink({});
    throw;
  }
  set_log_level(LogLevel::warn);
  set_log_sink({});
  std::lock_guard lock(mu);
  out.log = lines;
  return out;
}

template <class Resolver>
bool is(const Picked& p) {
  return dynamic_cast<Resolver*>(p.resolver.get()) != nullptr;
}

const Vars kSlurmStep{{"SLURM_STEP_ID", "0"},
                      {"SLURM_PROCID", "1"},
                      {"SLURM_STEP_NUM_TASKS", "2"},
                      {"SLURM_STEP_NODELIST", "n[1-2]"},
                      {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};

TEST(ClusterResolverFromEnvironment, TfConfigComesFirst) {
  const auto p = pick(changed(kTorchrun, {{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:2"]},
                                                         "task": {"type": "worker", "index": 1}})"}}));
  ASSERT_TRUE(is<TFConfigClusterResolver>(p)) << p.log;
  EXPECT_EQ(p.resolver->task_id(), 1);
  EXPECT_EQ(p.log,
            "cluster_resolver_from_environment: TF_CONFIG is set; the cluster comes from TF_CONFIG: task worker 1 of "
            "2 workers\n");
}

TEST(ClusterResolverFromEnvironment, TorchrunsVariablesComeNextEvenInsideASlurmStep) {
  // `srun torchrun ...`: torchrun's workers inherit the step's variables.
  const auto p = pick(changed(kSlurmStep, changed(kTorchrun, {{"TF_CONFIG", "  "}})));
  ASSERT_TRUE(is<TorchrunClusterResolver>(p)) << p.log;
  EXPECT_EQ(p.resolver->task_id(), 1);
  EXPECT_EQ(p.log,
            "cluster_resolver_from_environment: RANK or WORLD_SIZE is set (torchrun); the cluster comes from "
            "torchrun's variables (RANK=1, WORLD_SIZE=3, MASTER_ADDR=node0, MASTER_PORT=29500): task worker 1 of 3 "
            "workers\n");
}

TEST(ClusterResolverFromEnvironment, OpenMpiComesBeforeTheSlurmStepItsDaemonsRunIn) {
  // mpirun inside an allocation starts its daemons with srun: its ranks inherit a step's variables.
  const auto p = pick(changed(kSlurmStep, kOpenMpi));
  ASSERT_TRUE(is<MPIClusterResolver>(p)) << p.log;
  EXPECT_EQ(p.resolver->task_id(), 1);
  EXPECT_THAT(p.log, HasSubstr("OMPI_COMM_WORLD_RANK is set (Open MPI); the cluster comes from MPI's variables"));
}

TEST(ClusterResolverFromEnvironment, ASlurmStepsTaskGetsTheSlurmResolver) {
  // srun --mpi=pmi2 gives each task its SLURM_PROCID as PMI_RANK too.
  const auto p =
      pick(changed(kSlurmStep, {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MIRRORED_SLURM_PORT_BASE", "2222"}}));
  ASSERT_TRUE(is<SlurmClusterResolver>(p)) << p.log;
  EXPECT_EQ(p.resolver->cluster_spec(), workers({"n1:2222", "n2:2222"}));
  EXPECT_EQ(p.resolver->task_id(), 1);
  EXPECT_EQ(p.log,
            "cluster_resolver_from_environment: SLURM_STEP_ID and SLURM_PROCID are set (a task of a Slurm job step); "
            "the cluster comes from Slurm's variables (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2): task worker 1 of 2 "
            "workers\n");
  // TF's port base by default.
  EXPECT_EQ(pick(kSlurmStep).resolver->cluster_spec(), workers({"n1:8888", "n2:8888"}));
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([] {
                pick(changed(kSlurmStep, {{"MIRRORED_SLURM_PORT_BASE", "0"}}));
              }),
              HasSubstr("MIRRORED_SLURM_PORT_BASE='0' is not a port"));
}

TEST(ClusterResolverFromEnvironment, AnMpiLauncherInsideASlurmStepGetsTheMpiResolver) {
  // MPICH's mpiexec starts its proxies with srun: PMI_RANK is the MPI rank, SLURM_PROCID the proxy's.
  const auto p = pick(changed(
      kSlurmStep,
      {{"SLURM_PROCID", "0"}, {"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(is<MPIClusterResolver>(p)) << p.log;
  EXPECT_EQ(p.resolver->task_id(), 3);
  EXPECT_EQ(p.resolver->cluster_spec(), workers({"n1:29500", "", "", ""}));
  EXPECT_THAT(p.log, HasSubstr("PMI_RANK or PMIX_RANK is set (an MPI launcher)"));
}

TEST(ClusterResolverFromEnvironment, AnSbatchScriptOrNoLauncherIsOneLocalWorker) {
  // The batch script itself has SLURM_PROCID but no step id: it is not one of the step's tasks.
  for (const Vars& vars : {Vars{}, Vars{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "n1"}}}) {
    const auto p = pick(vars);
    ASSERT_TRUE(is<TFConfigClusterResolver>(p)) << p.log;
    EXPECT_TRUE(p.resolver->cluster_spec().empty());
    EXPECT_EQ(p.log,
              "cluster_resolver_from_environment: no launcher's variables are set: a single local worker; the cluster "
              "comes from TF_CONFIG: task worker 0 of 1 workers\n");
  }
}

TEST(ClusterResolverFromEnvironment, PartialVariablesAreErrorsNotASingleWorker) {
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([] {
                pick({{"WORLD_SIZE", "2"}});
              }),
              HasSubstr("TorchrunClusterResolver: RANK is not set (WORLD_SIZE=2)"));
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([] {
                pick({{"PMIX_RANK", "1"}});
              }),
              HasSubstr("MPIClusterResolver: OMPI_COMM_WORLD_SIZE or PMI_SIZE is not set (PMIX_RANK=1)"));
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([] {
                pick({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}});
              }),
              HasSubstr("SlurmClusterResolver: SLURM_STEP_NUM_TASKS or SLURM_NTASKS is not set"));
}

// A Slurm step's task: its place among the tasks of its node, and the GPUs each task was given.
const Vars kTwoNodesOfTwoTasks{{"SLURM_STEP_ID", "0"},
                               {"SLURM_PROCID", "3"},
                               {"SLURM_LOCALID", "1"},
                               {"SLURM_STEP_NUM_TASKS", "4"},
                               {"SLURM_STEP_NODELIST", "n[1-2]"},
                               {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}};

LocalPlacement slurm_placement(const Vars& vars) {
  auto env = only(vars);
  return SlurmClusterResolver().local_placement();
}

TEST(SlurmResolver, ATasksPlaceIsItsLocalIdAmongTheTasksOfItsNode) {
  EXPECT_EQ(slurm_placement(kTwoNodesOfTwoTasks),
            (LocalPlacement{1, 2, 0, "Slurm's SLURM_LOCALID=1, SLURM_STEP_TASKS_PER_NODE=2(x2)"}));
  EXPECT_EQ(slurm_placement(changed(kTwoNodesOfTwoTasks, {{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "0"}})),
            (LocalPlacement{0, 2, 0, "Slurm's SLURM_LOCALID=0, SLURM_STEP_TASKS_PER_NODE=2(x2)"}));
  // Nodes with different numbers of tasks: task 3 is the only one of the second node.
  EXPECT_EQ(
      slurm_placement(changed(kTwoNodesOfTwoTasks, {{"SLURM_STEP_TASKS_PER_NODE", "3,1"}, {"SLURM_LOCALID", "0"}})),
      (LocalPlacement{0, 1, 0, "Slurm's SLURM_LOCALID=0, SLURM_STEP_TASKS_PER_NODE=3,1"}));
  // Without SLURM_LOCALID (and from the job's variables): the place in the blocks of the node list.
  EXPECT_EQ(slurm_placement(changed(kTwoNodesOfTwoTasks, {{"SLURM_LOCALID", ""},
                                                          {"SLURM_PROCID", "1"},
                                                          {"SLURM_STEP_NUM_TASKS", ""},
                                                          {"SLURM_NTASKS", "4"},
                                                          {"SLURM_STEP_TASKS_PER_NODE", ""},
                                                          {"SLURM_TASKS_PER_NODE", "2(x2)"}})),
            (LocalPlacement{1, 2, 0, "Slurm's SLURM_PROCID=1, SLURM_TASKS_PER_NODE=2(x2)"}));
}

TEST(SlurmResolver, GpusPerTaskAreEachTasksOwn) {
  for (const auto& [text, count] :
       std::vector<std::pair<std::string, int>>{{"2", 2}, {"a100:2", 2}, {"a100:1,v100:1", 2}, {"0", 0}}) {
    EXPECT_EQ(
        slurm_placement(changed(kTwoNodesOfTwoTasks, {{"SLURM_GPUS_PER_TASK", text}})),
        (LocalPlacement{1, 2, count,
                        "Slurm's SLURM_LOCALID=1, SLURM_STEP_TASKS_PER_NODE=2(x2), SLURM_GPUS_PER_TASK=" + text}));
  }
  EXPECT_THAT(launcher_error<SlurmClusterResolver>(changed(kTwoNodesOfTwoTasks, {{"SLURM_GPUS_PER_TASK", "two"}})),
              HasSubstr("SlurmClusterResolver: SLURM_GPUS_PER_TASK has a malformed number 'two'"));
  EXPECT_THAT(launcher_error<SlurmClusterResolver>(changed(kTwoNodesOfTwoTasks, {{"SLURM_LOCALID", "x"}})),
              HasSubstr("SlurmClusterResolver: SLURM_LOCALID has a malformed number 'x'"));
}

TEST(SlurmResolver, TasksNotDealtToTheNodesInBlocksAreAnError) {
  // srun --distribution=cyclic: task 1 is the first of the second node, where the cluster spec
  // (TF's, in blocks) puts task 2; it would listen on n1's address.
  EXPECT_EQ(launcher_error<SlurmClusterResolver>(
                changed(kTwoNodesOfTwoTasks, {{"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}})),
            "SlurmClusterResolver: SLURM_LOCALID=0 but task SLURM_PROCID=1 is task 1 of n1 in "
            "SLURM_STEP_TASKS_PER_NODE ('2(x2)'): the step's tasks are not dealt to its nodes in blocks, as the "
            "cluster spec (TF's) deals them, so this task would get another's address; run the step with srun "
            "--distribution=block");
}

TEST(ClusterResolverFromEnvironment, TfConfigSaysNothingOfMachines) {
  const auto p =
      pick({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "a:2"]}, "task": {"type": "worker", "index": 1}})"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(p.resolver->local_placement(), LocalPlacement{});
}

// A launcher that names only the chief: the others' addresses are empty.
TEST(LauncherClusters, WorkersWithoutAddressesGetNamesAndTheChiefMustHaveOne) {
  using detail::cluster::resolve_layout;
  const auto layout = resolve_layout(workers({"c:1", "", ""}), "worker", 2, "torchrun's variables");
  EXPECT_EQ(layout.num_workers, 3);
  EXPECT_EQ(layout.rank, 2);
  EXPECT_EQ(layout.names, (std::vector<std::string>{"worker 0 (c:1)", "worker 1", "worker 2"}));
  EXPECT_EQ(testing::error_of<InvalidArgumentError>([] {
              resolve_layout(workers({"", "b:2"}), "worker", 1, "X");
            }),
            "X: cluster.worker[0], the chief, has no address; it serves the job's store there, so it must be "
            "host:port");
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([] {
                resolve_layout(ClusterSpec{{{"chief", {""}}, {"worker", {"a:1"}}}}, "worker", 0, "X");
              }),
              HasSubstr("X: cluster.chief[0], the chief, has no address"));
}

TEST(LauncherClusters, AWorkerWithoutAnAddressListensOnItsRouteToTheChief) {
  using detail::cluster::resolve_layout;
  EXPECT_EQ(resolve_layout(workers({"127.0.0.1:9", "10.9.8.7:1"}), "worker", 1, "X").own_host(), "10.9.8.7");
  EXPECT_EQ(resolve_layout(workers({"127.0.0.1:9", ""}), "worker", 1, "X").own_host(), "127.0.0.1");
  EXPECT_EQ(resolve_layout(workers({"127.0.0.1:9", ""}), "worker", 0, "X").own_host(), "127.0.0.1");
}

// Worker processes given a launcher's variables only (no TF_CONFIG).
constexpr double kLauncherJobSeconds = 120;

std::vector<Vars> torchrun_workers(int n, const std::string& port, const std::vector<int>& sizes = {}) {
  std::vector<Vars> out;
  for (int r = 0; r < n; ++r) {
    const int size = sizes.empty() ? n : sizes[static_cast<std::size_t>(r)];
    out.push_back({{"RANK", std::to_string(r)},
                   {"WORLD_SIZE", std::to_string(size)},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port}});
  }
  return out;
}

TEST(LauncherJobs, WorkersThatKnowOnlyTheRendezvousAddressMeetThroughTheChiefsStore) {
  // Over TCP: each worker listens on its route to the chief and publishes that address.
  const std::string port = std::to_string(testing::free_port());
  testing::Job job(torchrun_workers(3, port), {MIRRORED_MW_WORKER, "collectives", "--replicas", "2", "--timeout", "60"},
                   {{"MIRRORED_SHARED_MEMORY", "0"}, {"MIRRORED_LOG_LEVEL", "INFO"}});
  ASSERT_TRUE(job.wait(kLauncherJobSeconds)) << job.outputs();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.code(r), 0) << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr("OK worker " + std::to_string(r)));
  }
  EXPECT_THAT(job.output(2), HasSubstr("MultiWorkerMirroredStrategy: worker 2 joined a job of 3 workers (the chief's "
                                       "store at 127.0.0.1:" +
                                       port + "; cross-worker transport: Gloo ring over TCP)"));
  EXPECT_THAT(job.output(0), HasSubstr("worker 0 (127.0.0.1:" + port + ") joined a job of 3 workers"));
}

TEST(LauncherJobs, OpenMpisVariablesMakeAJobToo) {
  const std::string port = std::to_string(testing::free_port());
  std::vector<Vars> per;
  for (int r = 0; r < 2; ++r)
    per.push_back({{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"PMIX_RANK", std::to_string(r)},
                   {"MIRRORED_MASTER_ADDR", "127.0.0.1"},
                   {"MIRRORED_MASTER_PORT", port}});
  testing::Job job(per, {MIRRORED_MW_WORKER, "hello", "--timeout", "60"});
  ASSERT_TRUE(job.wait(kLauncherJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
  EXPECT_THAT(job.output(1), HasSubstr("hello from worker 1 of 2"));
}

TEST(LauncherJobs, WorkersWhoseWorldSizesDifferFailNamingTheVariables) {
  const std::string port = std::to_string(testing::free_port());
  testing::Job job(torchrun_workers(2, port, {2, 3}), {MIRRORED_MW_WORKER, "hello", "--timeout", "30"});
  ASSERT_TRUE(job.wait(kLauncherJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 1) << job.outputs();
  EXPECT_EQ(job.code(1), 1) << job.outputs();
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(job.output(r), HasSubstr("unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy start-up: "))
        << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr("worker 1 has a cluster of 3 workers")) << job.outputs();
  }
  EXPECT_THAT(job.output(0), HasSubstr("; this worker's cluster comes from torchrun's variables (RANK=0, WORLD_SIZE=2, "
                                       "MASTER_ADDR=127.0.0.1, MASTER_PORT=" +
                                       port + ")"));
  EXPECT_THAT(job.output(1), HasSubstr("; this worker's cluster comes from torchrun's variables (RANK=1, WORLD_SIZE=3, "
                                       "MASTER_ADDR=127.0.0.1, MASTER_PORT=" +
                                       port + ")"));
}

}  // namespace
}  // namespace mirrored
