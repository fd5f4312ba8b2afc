// The consumer's use of mirrored::eigen: an Eigen view of a tensor.
#include <mirrored/eigen.hpp>

float eigen_sum() {
  mirrored::Tensor<float> t{1.0f, 2.0f, 3.0f};
  return mirrored::as_vector(t).sum();
}
