// (variable, gradient) pairs instead of (gradient, variable).
#include <mirrored/mirrored.hpp>

#include <utility>
#include <vector>

using namespace mirrored;

int main() {
  Variable<float> w(Tensor<float>{1, 2});
  optimizers::SGD<float> opt;
  std::vector<std::pair<Variable<float>, Tensor<float>>> wrong{{w, Tensor<float>{1, 1}}};
  opt.apply_gradients(wrong);
}
