// PreemptionCheckpointHandler in one process: a SIGTERM (a real one, raised in this process) or
// request_preemption saves after the step and calls exit_fn with 75; the restarted handler
// resumes at that step; periodic saves; misuse.
#include <signal.h>

#include <mirrored/preemption_checkpoint_handler.hpp>

#include "checkpoint/manager_test_util.hpp"

namespace mirrored {
namespace preemption_handler_test {

using namespace manager_testing;
using ::testing::HasSubstr;

// exit_fn of the tests: records the status and returns (the handler then refuses further steps).
struct Exits {
  std::vector<int> codes;
  std::function<void(int)> fn() {
    return [this](int code) { codes.push_back(code); };
  }
};

// One training step of `m` through `h` (the step number is the handler's count).
void step(Model& m, PreemptionCheckpointHandler& h) {
  const int s = static_cast<int>(h.total_run_calls());
  h.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    optimizers::GradsAndVars<float> gv;
    for (std::size_t k = 0; k < m.vars.size(); ++k)
      gv.emplace_back(gradient(kShapes[k], static_cast<int>(k), r, s), m.vars[k]);
    m.opt->apply_gradients(gv);
  });
}

TEST_F(ManagerTest, ASigtermSavesAfterTheStepAndExitsWithTheRestartStatus) {
  Model m(2, Opt::adam, false);
  checkpoint::CheckpointManager mgr(m.strategy, dir_);
  m.track(mgr);
  Exits exits;
  PreemptionCheckpointHandler h(m.strategy, mgr);
  h.exit_fn = exits.fn();
  EXPECT_EQ(h.total_run_calls(), 0);
  for (int i = 0; i < 3; ++i) step(m, h);
  EXPECT_FALSE(h.preemption_requested());
  EXPECT_TRUE(exits.codes.empty());
  ASSERT_EQ(::raise(SIGTERM), 0);  // the handler's SIGTERM handler only sets its flag
  EXPECT_TRUE(h.preemption_requested());
  step(m, h);
  ASSERT_EQ(exits.codes, std::vector<int>{PreemptionCheckpointHandler::kRestartExitCode});
  EXPECT_EQ(PreemptionCheckpointHandler::kRestartExitCode, 75);
  EXPECT_EQ(h.total_run_calls(), 4);
  EXPECT_EQ(mgr.latest_checkpoint(), file("ckpt-4.safetensors"));
  const State at_stop = state_of(m);
  // Stopped: no more steps.
  const std::string refused = error_of<FailedPreconditionError>([&] { step(m, h); });
  EXPECT_THAT(refused, HasSubstr("preempted and saved at step 4"));
  EXPECT_EQ(h.total_run_calls(), 4);

  // The restart: a fresh model resumes at step 4 with the same state, and training on gives the
  // bits of the uninterrupted run.
  Model resumed(2, Opt::adam, false, /*init_seed=*/1);
  checkpoint::CheckpointManager mgr2(resumed.strategy, dir_);
  resumed.track(mgr2);
  PreemptionCheckpointHandler h2(resumed.strategy, mgr2);
  h2.exit_fn = exits.fn();
  EXPECT_EQ(h2.total_run_calls(), 4);
  EXPECT_EQ(state_of(resumed), at_stop);
  for (int i = 0; i < 3; ++i) step(resumed, h2);
  Model straight(2, Opt::adam, false);
  straight.train(0, 7);
  EXPECT_EQ(state_of(resumed), state_of(straight));
  EXPECT_EQ(exits.codes.size(), 1u);
}

TEST_F(ManagerTest, RequestPreemptionDoesWhatSigtermDoes) {
  Model m(1, Opt::momentum, false);
  checkpoint::CheckpointManager mgr(m.strategy, dir_);
  m.track(mgr);
  Exits exits;
  PreemptionCheckpointHandler h(m.strategy, mgr);
  h.exit_fn = exits.fn();
  step(m, h);
  h.request_preemption();
  step(m, h);
  EXPECT_EQ(exits.codes, std::vector<int>{75});
  EXPECT_EQ(mgr.latest_checkpoint(), file("ckpt-2.safetensors"));
}

TEST_F(ManagerTest, PeriodicSavesHappenEverySaveEverySteps) {
  Model m(2, Opt::momentum, true);
  checkpoint::CheckpointManager mgr(m.strategy, dir_, /*max_to_keep=*/10);
  m.track(mgr);
  PreemptionCheckpointHandler h(m.strategy, mgr, /*save_every_steps=*/3);
  h.exit_fn = [](int) { ADD_FAILURE() << "no preemption was asked for"; };
  for (int i = 0; i < 7; ++i) step(m, h);
  EXPECT_EQ(listing_but_spares(dir_),
            (std::vector<std::string>{"checkpoint", "ckpt-3.safetensors", "ckpt-6.safetensors"}));
  // A crash now loses step 7 only: a new handler resumes at 6.
  Model again(2, Opt::momentum, true, 1);
  checkpoint::CheckpointManager mgr2(again.strategy, dir_, 10);
  again.track(mgr2);
  PreemptionCheckpointHandler h2(again.strategy, mgr2, 3);
  EXPECT_EQ(h2.total_run_calls(), 6);
}

TEST_F(ManagerTest, AStepThatThrowsIsNotCounted) {
  Model m(2, Opt::momentum, false);
  checkpoint::CheckpointManager mgr(m.strategy, dir_);
  m.track(mgr);
  PreemptionCheckpointHandler h(m.strategy, mgr, 1);
  EXPECT_THROW(h.run([] { throw InvalidArgumentError("bad batch"); }), InvalidArgumentError);
  EXPECT_EQ(h.total_run_calls(), 0);
  EXPECT_FALSE(mgr.latest_checkpoint().has_value());
  // run returns what Strategy::run returns.
  const PerReplica<int> ids = h.run([] { return get_replica_context()->replica_id_in_sync_group(); });
  EXPECT_EQ(ids.values(), (std::vector<int>{0, 1}));
  EXPECT_EQ(h.total_run_calls(), 1);
}

TEST_F(ManagerTest, ANegativeSaveIntervalIsRefused) {
  Model m(1, Opt::momentum, false);
  checkpoint::CheckpointManager mgr(m.strategy, dir_);
  const std::string msg = error_of<InvalidArgumentError>([&] { PreemptionCheckpointHandler h(m.strategy, mgr, -2); });
  EXPECT_THAT(msg, HasSubstr("save_every_steps must be >= 0"));
  EXPECT_THAT(msg, HasSubstr("-2"));
}

TEST_F(ManagerTest, TheSigtermDispositionIsPutBackWhenTheLastHandlerGoes) {
  struct sigaction before {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &before), 0);
  {
    Model m(1, Opt::momentum, false);
    checkpoint::CheckpointManager mgr(m.strategy, dir_);
    PreemptionCheckpointHandler h(m.strategy, mgr);
    struct sigaction during {};
    ASSERT_EQ(sigaction(SIGTERM, nullptr, &during), 0);
    EXPECT_NE(during.sa_handler, before.sa_handler);
  }
  struct sigaction after {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

}  // namespace preemption_handler_test
}  // namespace mirrored
