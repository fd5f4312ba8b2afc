// A step that takes a dataset's (x, y) element as two parameters: each replica gets the element as
// one std::tuple, so run must say so at compile time.
#include <mirrored/mirrored.hpp>

#include <tuple>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  auto batches = strategy.experimental_distribute_values_from_function(
      [](const ValueContext&) { return std::make_tuple(Tensor<float>::zeros({2}), Tensor<int64_t>::zeros({2})); });
  strategy.run([](const Tensor<float>& x, const Tensor<int64_t>& y) { return x.numel() + y.numel(); }, batches);
}
