// Seed: the variable samples of the MirroredStrategy page — a variable created in the scope is a
// MirroredVariable; one created by a function called in the scope is too; one created outside
// is a regular variable.
#include <iostream>
#include <vector>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  std::cout << "# a variable created inside the scope\n";
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  std::optional<Variable<float>> x;
  {
    auto scope = strategy.scope();
    x.emplace(1.0f);
  }
  std::cout << *x << "\n";

  std::cout << "# a variable created by a function called inside the scope\n";
  std::vector<Variable<float>> created;
  auto create_variable = [&]() -> Variable<float> {
    if (created.empty()) created.emplace_back(1.0f);
    return created[0];
  };
  {
    auto scope = strategy.scope();
    (void)create_variable();
    std::cout << created[0] << "\n";
  }

  std::cout << "# scope(): inside and outside\n";
  std::optional<Variable<float>> mirrored_variable;
  {
    auto scope = strategy.scope();
    mirrored_variable.emplace(1.0f);
  }
  std::cout << *mirrored_variable << "\n";
  Variable<float> regular_variable(1.0f);
  std::cout << regular_variable << "\n";
}
