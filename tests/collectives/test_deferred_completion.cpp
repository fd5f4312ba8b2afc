// DeferredCompletion (src/collectives/deferred_completion.hpp): the completion waits an
// asynchronous collective's lane runs after publishing its result (NCCL's, on a GPU; no GPU here,
// so the hand-over itself is tested).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/deferred_completion.hpp"

namespace mirrored::deferred_completion_test {

using detail::DeferredCompletion;

TEST(DeferredCompletion, WithoutAScopeTheCallerWaitsItself) {
  bool ran = false;
  EXPECT_FALSE(DeferredCompletion::defer([&] { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST(DeferredCompletion, RunsWhatWasHandedOverInOrderOnceAndThrowsTheFirstFailure) {
  std::vector<int> order;
  DeferredCompletion deferred;
  EXPECT_TRUE(DeferredCompletion::defer([&] { order.push_back(1); }));
  EXPECT_TRUE(DeferredCompletion::defer([&] {
    order.push_back(2);
    throw std::runtime_error("first");
  }));
  EXPECT_TRUE(DeferredCompletion::defer([&] {
    order.push_back(3);
    throw std::runtime_error("second");
  }));
  EXPECT_TRUE(order.empty());
  try {
    deferred.run();
    ADD_FAILURE() << "run() did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "first");
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));  // the later wait still ran
  EXPECT_NO_THROW(deferred.run());                // each once
  EXPECT_EQ(order.size(), 3u);
}

TEST(DeferredCompletion, TheInnermostScopeTakesThemAndTheDestructorRunsTheRest) {
  int outer_ran = 0, inner_ran = 0;
  {
    DeferredCompletion outer;
    {
      DeferredCompletion inner;
      EXPECT_TRUE(DeferredCompletion::defer([&] { ++inner_ran; }));
      EXPECT_EQ(inner_ran, 0);
    }  // not run explicitly: the destructor does it
    EXPECT_EQ(inner_ran, 1);
    EXPECT_TRUE(DeferredCompletion::defer([&] {
      ++outer_ran;
      throw std::runtime_error("logged, not thrown");
    }));
  }
  EXPECT_EQ(outer_ran, 1);
  EXPECT_FALSE(DeferredCompletion::defer([] {}));  // no scope left
}

}  // namespace mirrored::deferred_completion_test
