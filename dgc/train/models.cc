#include "dgc/train/models.h"

#include <mutex>

#include <torch/nn.h>
#include <torch/utils.h>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

namespace F = torch::nn::functional;

// conv 1->32 3x3, pool, conv 32->32 3x3, pool, fc 1568->256, fc 256->10: 413,802 parameters,
// nearly all in one fully connected layer (cheap to compute, large to send: the case DGC is for).
class Cnn : public Classifier {
 public:
  Cnn()
      : conv1_(register_module("conv1",
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2_(register_module("conv2",
                               torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1)))),
        fc1_(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 256))),
        fc2_(register_module("fc2", torch::nn::Linear(256, kNumClasses))) {}

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = F::max_pool2d(torch::relu(conv1_(images)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2_(x)), F::MaxPool2dFuncOptions(2));
    x = torch::relu(fc1_(x.flatten(1)));
    return fc2_(x);
  }

 private:
  torch::nn::Conv2d conv1_, conv2_;
  torch::nn::Linear fc1_, fc2_;
};

// 784 -> 512 -> 256 -> 10 with ReLU: 535,818 parameters.
class Mlp : public Classifier {
 public:
  Mlp()
      : fc1_(register_module("fc1", torch::nn::Linear(kImageSize * kImageSize, 512))),
        fc2_(register_module("fc2", torch::nn::Linear(512, 256))),
        fc3_(register_module("fc3", torch::nn::Linear(256, kNumClasses))) {}

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = torch::relu(fc1_(images.flatten(1)));
    x = torch::relu(fc2_(x));
    return fc3_(x);
  }

 private:
  torch::nn::Linear fc1_, fc2_, fc3_;
};

// He et al. (2016) CIFAR ResNet basic block with the parameter-free shortcut ("option A"):
// strided subsampling and zero-padded channels when the shape changes.
class BasicBlock : public torch::nn::Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride)
      : conv1_(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, 3)
                                           .stride(stride)
                                           .padding(1)
                                           .bias(false)))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(out_channels))),
        conv2_(register_module(
            "conv2",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(out_channels, out_channels, 3).padding(1).bias(false)))),
        bn2_(register_module("bn2", torch::nn::BatchNorm2d(out_channels))),
        stride_(stride),
        pad_channels_(out_channels - in_channels) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1_(conv1_(x)));
    out = bn2_(conv2_(out));
    auto shortcut = x;
    if (stride_ != 1) {
      shortcut = shortcut.slice(2, 0, c10::nullopt, stride_).slice(3, 0, c10::nullopt, stride_);
    }
    if (pad_channels_ > 0) {
      shortcut = F::pad(shortcut, F::PadFuncOptions({0, 0, 0, 0, pad_channels_ / 2,
                                                     pad_channels_ - pad_channels_ / 2}));
    }
    return torch::relu(out + shortcut);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_;
  int64_t stride_;
  int64_t pad_channels_;
};

// ResNet-20 (3 stages x 3 blocks, 16/32/64 channels) on 28x28x1: stages at 28, 14 and 7 pixels,
// global average pooling, fc 64->10. 269,434 parameters.
class ResNet20 : public Classifier {
 public:
  ResNet20()
      : conv_(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)))),
        bn_(register_module("bn", torch::nn::BatchNorm2d(16))),
        fc_(register_module("fc", torch::nn::Linear(64, kNumClasses))) {
    int64_t in_channels = 16;
    const int64_t widths[3] = {16, 32, 64};
    for (int stage = 0; stage < 3; ++stage) {
      for (int block = 0; block < 3; ++block) {
        const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
        blocks_.push_back(
            register_module("layer" + std::to_string(stage + 1) + "_" + std::to_string(block),
                            std::make_shared<BasicBlock>(in_channels, widths[stage], stride)));
        in_channels = widths[stage];
      }
    }
    // Kaiming-normal convolutions, as in the CIFAR ResNet reference.
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
    }
  }

  torch::Tensor forward(const torch::Tensor& images) override {
    auto x = torch::relu(bn_(conv_(images)));
    for (auto& block : blocks_) x = block->forward(x);
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    return fc_(x);
  }

 private:
  torch::nn::Conv2d conv_;
  torch::nn::BatchNorm2d bn_;
  torch::nn::Linear fc_;
  std::vector<std::shared_ptr<BasicBlock>> blocks_;
};

std::mutex& init_mutex() {
  static std::mutex mutex;
  return mutex;
}

}  // namespace

std::vector<std::string> model_names() { return {"cnn", "mlp", "resnet20"}; }

std::shared_ptr<Classifier> make_model(const std::string& name, uint64_t seed) {
  std::lock_guard<std::mutex> lock(init_mutex());
  torch::manual_seed(seed);
  if (name == "cnn") return std::make_shared<Cnn>();
  if (name == "mlp") return std::make_shared<Mlp>();
  if (name == "resnet20") return std::make_shared<ResNet20>();
  throw InvalidArgument("unknown model '" + name + "': expected one of cnn, mlp, resnet20");
}

int64_t parameter_count(const torch::nn::Module& model) {
  int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

}  // namespace dgc::train
