// Double gradients for a float optimizer.
#include <mirrored/mirrored.hpp>

#include <utility>
#include <vector>

using namespace mirrored;

int main() {
  Variable<double> w(Tensor<double>{1, 2});
  optimizers::SGD<float> opt;
  optimizers::GradsAndVars<double> grads{{Tensor<double>{1, 1}, w}};
  opt.apply_gradients(grads);
}
