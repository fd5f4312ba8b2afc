#pragma once
// Helpers for assertions on the main thread (they report through gtest, so never call them from
// replica or background threads: use harness.hpp's message_of there).
#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace mirrored::testing {

/// The message of the `E` that `fn` throws; a gtest failure if it throws something else or nothing.
template <class E, class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "threw nothing";
  return {};
}

}  // namespace mirrored::testing
