#include "dgc/train/model_shapes.h"

#include <string>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

void conv(std::vector<NamedShape>& out, const std::string& name, int64_t out_channels,
          int64_t in_channels, int64_t kernel, bool bias) {
  out.push_back({name + ".weight", {out_channels, in_channels, kernel, kernel}});
  if (bias) out.push_back({name + ".bias", {out_channels}});
}

void batch_norm(std::vector<NamedShape>& out, const std::string& name, int64_t channels) {
  out.push_back({name + ".weight", {channels}});
  out.push_back({name + ".bias", {channels}});
}

void linear(std::vector<NamedShape>& out, const std::string& name, int64_t out_features,
            int64_t in_features) {
  out.push_back({name + ".weight", {out_features, in_features}});
  out.push_back({name + ".bias", {out_features}});
}

// torchvision's ResNet-50: Bottleneck blocks [3, 4, 6, 3], expansion 4, downsample on the first
// block of every layer.
std::vector<NamedShape> resnet50() {
  std::vector<NamedShape> out;
  conv(out, "conv1", 64, 3, 7, false);
  batch_norm(out, "bn1", 64);
  const int blocks[] = {3, 4, 6, 3};
  int64_t inplanes = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t planes = int64_t{64} << layer;
    for (int b = 0; b < blocks[layer]; ++b) {
      const std::string prefix =
          "layer" + std::to_string(layer + 1) + "." + std::to_string(b) + ".";
      conv(out, prefix + "conv1", planes, inplanes, 1, false);
      batch_norm(out, prefix + "bn1", planes);
      conv(out, prefix + "conv2", planes, planes, 3, false);
      batch_norm(out, prefix + "bn2", planes);
      conv(out, prefix + "conv3", planes * 4, planes, 1, false);
      batch_norm(out, prefix + "bn3", planes * 4);
      if (b == 0) {
        conv(out, prefix + "downsample.0", planes * 4, inplanes, 1, false);
        batch_norm(out, prefix + "downsample.1", planes * 4);
      }
      inplanes = planes * 4;
    }
  }
  linear(out, "fc", 1000, 2048);
  return out;
}

std::vector<NamedShape> alexnet() {
  std::vector<NamedShape> out;
  conv(out, "features.0", 64, 3, 11, true);
  conv(out, "features.3", 192, 64, 5, true);
  conv(out, "features.6", 384, 192, 3, true);
  conv(out, "features.8", 256, 384, 3, true);
  conv(out, "features.10", 256, 256, 3, true);
  linear(out, "classifier.1", 4096, 256 * 6 * 6);
  linear(out, "classifier.4", 4096, 4096);
  linear(out, "classifier.6", 1000, 4096);
  return out;
}

// torchvision's VGG-16 (configuration "D"): 13 3x3 convolutions with ReLU (and max-pooling
// between the stages), then three linear layers.
std::vector<NamedShape> vgg16() {
  std::vector<NamedShape> out;
  const int64_t channels[] = {64, 64,  0,   128, 128, 0,   256, 256, 256,
                              0,  512, 512, 512, 0,   512, 512, 512, 0};
  int64_t in = 3;
  int index = 0;  // position in `features` (conv, ReLU, conv, ReLU, pool, ...)
  for (int64_t c : channels) {
    if (c == 0) {
      index += 1;  // MaxPool2d
      continue;
    }
    conv(out, "features." + std::to_string(index), c, in, 3, true);
    in = c;
    index += 2;  // Conv2d, ReLU
  }
  linear(out, "classifier.0", 4096, 512 * 7 * 7);
  linear(out, "classifier.3", 4096, 4096);
  linear(out, "classifier.6", 1000, 4096);
  return out;
}

std::vector<NamedShape> lstm_ptb() {
  constexpr int64_t vocabulary = 10000, hidden = 1500;
  std::vector<NamedShape> out;
  out.push_back({"encoder.weight", {vocabulary, hidden}});
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = "_l" + std::to_string(layer);
    out.push_back({"rnn.weight_ih" + l, {4 * hidden, hidden}});
    out.push_back({"rnn.weight_hh" + l, {4 * hidden, hidden}});
    out.push_back({"rnn.bias_ih" + l, {4 * hidden}});
    out.push_back({"rnn.bias_hh" + l, {4 * hidden}});
  }
  linear(out, "decoder", vocabulary, hidden);
  return out;
}

// dgc train's default CNN for Fashion-MNIST (dgc/train/models.cc).
std::vector<NamedShape> cnn() {
  std::vector<NamedShape> out;
  conv(out, "conv1", 32, 1, 3, true);
  conv(out, "conv2", 32, 32, 3, true);
  linear(out, "fc1", 256, 32 * 7 * 7);
  linear(out, "fc2", 10, 256);
  return out;
}

// The output positions (height x width) of the layer a tensor of `model` belongs to.
int64_t output_positions(const std::string& model, const std::string& name) {
  const auto starts = [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; };
  const auto square = [](int64_t side) { return side * side; };
  if (model == "resnet50") {
    if (starts("conv1") || starts("bn1")) return square(112);
    if (starts("fc")) return 1;
    // layerL.B.part: layer L works at 56 / 2^(L-1); the first block of layers 2-4 reduces in its
    // 3x3 convolution (torchvision), so its first 1x1 convolution runs at the input's size.
    const int layer = name[5] - '0';
    int64_t side = int64_t{56} >> (layer - 1);
    const bool first_block = name.compare(6, 3, ".0.") == 0;
    if (layer > 1 && first_block &&
        (name.find(".conv1.") != std::string::npos || name.find(".bn1.") != std::string::npos))
      side *= 2;
    return square(side);
  }
  if (model == "alexnet") {
    if (starts("features.0.")) return square(55);
    if (starts("features.3.")) return square(27);
    if (starts("features.")) return square(13);
    return 1;
  }
  if (model == "vgg16") {
    if (!starts("features.")) return 1;
    const int index = std::stoi(name.substr(9));
    const int stage = index < 4 ? 0 : index < 9 ? 1 : index < 16 ? 2 : index < 23 ? 3 : 4;
    return square(int64_t{224} >> stage);
  }
  if (model == "cnn") {
    if (starts("conv1")) return square(28);
    if (starts("conv2")) return square(14);
    return 1;
  }
  return 1;  // lstm-ptb: every weight once per time step
}

}  // namespace

std::vector<double> forward_flops(const std::string& model) {
  std::vector<double> flops;
  for (const auto& [name, shape] : model_shapes(model)) {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    flops.push_back(2.0 * static_cast<double>(n) *
                    static_cast<double>(output_positions(model, name)));
  }
  return flops;
}

const std::vector<std::string>& model_shape_names() {
  static const std::vector<std::string> names = {"resnet50", "alexnet", "vgg16", "lstm-ptb", "cnn"};
  return names;
}

std::vector<NamedShape> model_shapes(const std::string& model) {
  if (model == "resnet50") return resnet50();
  if (model == "alexnet") return alexnet();
  if (model == "vgg16") return vgg16();
  if (model == "lstm-ptb") return lstm_ptb();
  if (model == "cnn") return cnn();
  throw InvalidArgument("unknown model '" + model +
                        "' for replayed steps: expected resnet50, alexnet, vgg16, lstm-ptb or cnn");
}

int64_t parameter_count(const std::vector<NamedShape>& shapes) {
  int64_t total = 0;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  return total;
}

}  // namespace dgc::train
