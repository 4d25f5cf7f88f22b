// The parameter tensors (names and shapes) of well-known models, for replaying their DGC steps
// without their forward and backward passes (`dgc bench step`). Plain data: no libtorch.
//
//   resnet50   torchvision.models.resnet50 (He et al. 2016), 1000 classes: 161 tensors,
//              25,557,032 parameters (BatchNorm running statistics are buffers, not parameters)
//   alexnet    torchvision.models.alexnet (Krizhevsky et al. 2012, one-GPU variant), 1000
//              classes: 16 tensors, 61,100,840 parameters
//   vgg16      torchvision.models.vgg16 (Simonyan and Zisserman 2015, no BatchNorm), 1000
//              classes: 32 tensors, 138,357,544 parameters
//   lstm-ptb   the paper's language model: 2-layer LSTM with 1500 units on Penn Treebank
//   (vocabulary
//              10,000; Zaremba et al. 2014's large model, untied), as PyTorch's
//              word_language_model example names it: 11 tensors, 66,034,000 parameters
//   cnn        dgc train's default CNN for Fashion-MNIST: 8 tensors, 413,802 parameters
// Names follow the PyTorch modules, so the dense/compressed policy treats them as training would
// (1-D tensors dense).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dgc::train {

using NamedShape = std::pair<std::string, std::vector<int64_t>>;

// "resnet50", "alexnet", "vgg16", "lstm-ptb", "cnn".
const std::vector<std::string>& model_shape_names();

// The model's parameters in registration order. Throws dgc::InvalidArgument for another name.
std::vector<NamedShape> model_shapes(const std::string& model);

// Elements of all tensors.
int64_t parameter_count(const std::vector<NamedShape>& shapes);

// Forward FLOPs of each tensor of model_shapes(model) for one example: 2 x its elements x the
// output positions of its layer (a convolution's output height x width at the model's input size,
// 224 x 224 for the ImageNet models and 28 x 28 for cnn; 1 for linear layers and for lstm-ptb,
// whose weights all run once per time step). BatchNorm and bias tensors count the same way, for
// their small share. The backward pass takes about twice the forward FLOPs of each layer, so these
// are also the proportions of a backward pass (`dgc bench step --replay`).
std::vector<double> forward_flops(const std::string& model);

}  // namespace dgc::train
