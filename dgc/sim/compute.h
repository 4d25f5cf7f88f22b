// The compute time per training step (forward and backward pass on one node) that the simulated
// cluster and `dgc plan` assume by default for each replay model. A setting everywhere
// (--compute-seconds); these are the defaults and their sources.
//   resnet50, vgg16, alexnet: the training throughput (images/s, batch 30, SGD) of the MXNet
//   fine-tuning benchmark on a Maxwell GeForce GTX TITAN X (knjcode/mxnet-finetuner,
//   docs/benchmark.md): ResNet-50 109.98, VGG-16 59.80, CaffeNet (AlexNet's one-GPU variant)
//   1019.24 images/s, i.e. 0.273 s, 0.502 s and 0.029 s for 30 images (the figures
//   `dgc bench step` uses);
//   lstm-ptb, cnn: no published figure at hand; 0.1 s is an assumption.
#pragma once

#include <map>
#include <string>

namespace dgc::sim {

inline const std::map<std::string, double>& default_compute_seconds() {
  static const std::map<std::string, double> seconds = {
      {"resnet50", 30.0 / 109.98},
      {"vgg16", 30.0 / 59.80},
      {"alexnet", 30.0 / 1019.24},
      {"lstm-ptb", 0.1},
      {"cnn", 0.1},
  };
  return seconds;
}

}  // namespace dgc::sim
