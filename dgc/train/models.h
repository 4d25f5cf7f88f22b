// Models for 28x28 grey images with 10 classes (Fashion-MNIST): a small CNN (the default), an MLP
// and a CIFAR-style ResNet-20 adapted to one input channel and 28x28 inputs.
//
// Every model maps a float tensor [batch, 1, 28, 28] to logits [batch, 10]. None uses dropout or
// any other randomness in forward, so a training step depends only on the weights and the batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace dgc::train {

inline constexpr int kImageSize = 28;
inline constexpr int kNumClasses = 10;

class Classifier : public torch::nn::Module {
 public:
  // images: [batch, 1, 28, 28] float; returns logits [batch, 10].
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
};

// Names accepted by make_model, the default first: {"cnn", "mlp", "resnet20"}.
std::vector<std::string> model_names();

// Builds a freshly initialised model. Initialisation draws from libtorch's global generator,
// seeded with `seed` under a process-wide lock, so concurrent callers (worker threads) get the
// same weights for the same seed. Throws dgc::InvalidArgument for an unknown name.
std::shared_ptr<Classifier> make_model(const std::string& name, uint64_t seed);

// Total number of trainable elements.
int64_t parameter_count(const torch::nn::Module& model);

}  // namespace dgc::train
