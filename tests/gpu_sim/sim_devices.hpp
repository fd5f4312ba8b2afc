// The simulated GPUs the gpu_sim tests name (sim_environment.cpp makes the process simulate three;
// kGpu3 is the one that does not exist). One definition, so the test files can share a unity build.
#pragma once

#include <mirrored/mirrored.hpp>

namespace mirrored::testing {

inline const Device kGpu0(DeviceType::GPU, 0);
inline const Device kGpu1(DeviceType::GPU, 1);
inline const Device kGpu2(DeviceType::GPU, 2);
inline const Device kGpu3(DeviceType::GPU, 3);

}  // namespace mirrored::testing
