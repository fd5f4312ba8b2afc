#pragma once
// Helpers shared by the Tensor tests.
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "mirrored/device.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored::testing {

inline const Device kCpu1(DeviceType::CPU, 1);

/// The printed form of a tensor.
template <class T>
std::string str(const Tensor<T>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

template <class T>
std::vector<T> vec(std::initializer_list<T> v) {
  return std::vector<T>(v);
}

}  // namespace mirrored::testing
