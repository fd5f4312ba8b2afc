// A libtorch model trained with MirroredStrategy on two CPU replicas, its gradients all-reduced
// through DLPack without copies (build and run: `make interop`; needs Debian's libtorch-dev).
//
// Each replica has its own copy of a small MLP (same initial weights) and its own torch optimizer.
// A step: each replica computes the loss of its half of the global batch with torch autograd; its
// gradients enter the library as tensors that share torch's memory (at::toDLPack →
// Tensor::from_dlpack); one packed all-reduce averages them across replicas; the averaged tensors
// go back to torch as the parameters' gradients, again sharing memory (to_dlpack → at::fromDLPack);
// each replica's optimizer applies them. The replicas' weights must stay bitwise identical.

#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include <mirrored/dlpack.hpp>
#include <mirrored/mirrored.hpp>

namespace {

constexpr int kReplicas = 2;
constexpr int kGlobalBatch = 64;
constexpr int kFeatures = 8;
constexpr int kSteps = 60;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
}

[[noreturn]] void fail(const std::string& why) {
  std::cerr << "torch_mirrored: " << why << "\n";
  std::exit(1);
}

}  // namespace

int main() {
  using mirrored::Device;
  using mirrored::DeviceType;
  using mirrored::Tensor;
  torch::set_num_threads(1);  // one replica thread per core already

  // The data: y = x·w + 0.5 with a fixed w; replica r trains on rows [r·32, r·32 + 32) of each batch.
  torch::manual_seed(7);
  const torch::Tensor w_true = torch::randn({kFeatures, 1});
  const torch::Tensor x_all = torch::randn({kGlobalBatch, kFeatures});
  const torch::Tensor y_all = torch::matmul(x_all, w_true) + 0.5;
  const int64_t per_replica = kGlobalBatch / kReplicas;

  // One model copy per replica, with the same initial weights.
  std::vector<torch::nn::Sequential> models;
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  for (int r = 0; r < kReplicas; ++r) {
    torch::manual_seed(0);
    models.push_back(make_model());
    optimizers.push_back(std::make_unique<torch::optim::SGD>(models.back()->parameters(), /*lr=*/0.05));
  }

  mirrored::MirroredStrategy strategy({"CPU:0", "CPU:1"});
  std::cout << "torch_mirrored: " << strategy.num_replicas_in_sync() << " replicas, libtorch " << TORCH_VERSION
            << ", DLPack " << DLPACK_VERSION << "\n";

  for (int step = 0; step < kSteps; ++step) {
    auto losses = strategy.run([&] {
      const int r = mirrored::get_replica_context()->replica_id_in_sync_group();
      const Device here(DeviceType::CPU, r);
      torch::nn::Sequential& model = models[static_cast<std::size_t>(r)];
      const torch::Tensor x = x_all.narrow(0, r * per_replica, per_replica);
      const torch::Tensor y = y_all.narrow(0, r * per_replica, per_replica);

      for (torch::Tensor& p : model->parameters()) p.mutable_grad() = torch::Tensor();
      const torch::Tensor loss = torch::mse_loss(model->forward(x), y);
      loss.backward();

      // torch's gradients → the library, sharing memory.
      std::vector<Tensor<float>> grads;
      for (const torch::Tensor& p : model->parameters()) {
        Tensor<float> g = Tensor<float>::from_dlpack(at::toDLPack(p.grad()), here);
        if (g.data() != p.grad().data_ptr<float>()) fail("from_dlpack copied a gradient");
        grads.push_back(std::move(g));
      }
      const std::vector<Tensor<float>> mean =
          mirrored::get_replica_context()->all_reduce(mirrored::ReduceOp::MEAN, grads);

      // The averaged gradients → torch, sharing memory, and one optimizer step per replica.
      std::size_t i = 0;
      for (torch::Tensor& p : model->parameters()) {
        torch::Tensor g = at::fromDLPack(mirrored::to_dlpack(mean[i]));
        if (g.data_ptr<float>() != mean[i].data()) fail("fromDLPack copied a gradient");
        p.mutable_grad() = g;
        ++i;
      }
      optimizers[static_cast<std::size_t>(r)]->step();
      return loss.item<float>();
    });
    if (step % 10 == 0 || step == kSteps - 1) {
      const float mean_loss = strategy.reduce(mirrored::ReduceOp::MEAN, losses, std::nullopt);
      std::printf("step %2d  loss %.6f\n", step, static_cast<double>(mean_loss));
    }
  }

  // Same gradients, same optimizer: the copies must not have drifted by a single bit.
  const auto p0 = models[0]->parameters();
  for (int r = 1; r < kReplicas; ++r) {
    const auto pr = models[static_cast<std::size_t>(r)]->parameters();
    for (std::size_t i = 0; i < p0.size(); ++i)
      if (!torch::equal(p0[i], pr[i])) fail("replica " + std::to_string(r) + "'s weights differ from replica 0's");
  }
  std::cout << "replicas' weights identical after " << kSteps << " steps\n";
  return 0;
}
