// The replayed models' tensors add up to the parameter counts their sources publish
// (torchvision's model cards; Zaremba et al.'s large PTB model, as counted from its definition).
#include "dgc/train/model_shapes.h"

#include <set>

#include <gtest/gtest.h>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

struct Expected {
  const char* model;
  size_t tensors;
  int64_t parameters;
};

class ModelShapesTest : public ::testing::TestWithParam<Expected> {};

TEST_P(ModelShapesTest, CountsMatchTheSource) {
  const auto shapes = model_shapes(GetParam().model);
  EXPECT_EQ(shapes.size(), GetParam().tensors);
  EXPECT_EQ(parameter_count(shapes), GetParam().parameters);
  std::set<std::string> names;
  for (const auto& [name, shape] : shapes) {
    EXPECT_TRUE(names.insert(name).second) << "duplicate tensor name " << name;
    EXPECT_FALSE(shape.empty()) << name;
    for (int64_t d : shape) EXPECT_GT(d, 0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelShapesTest,
                         ::testing::Values(Expected{"resnet50", 161, 25'557'032},
                                           Expected{"alexnet", 16, 61'100'840},
                                           Expected{"vgg16", 32, 138'357'544},
                                           Expected{"lstm-ptb", 11, 66'034'000},
                                           Expected{"cnn", 8, 413'802}),
                         [](const auto& param_info) {
                           std::string name = param_info.param.model;
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(ModelShapes, ListsEveryModelAndRefusesOthers) {
  for (const auto& name : model_shape_names()) EXPECT_FALSE(model_shapes(name).empty()) << name;
  EXPECT_THROW(model_shapes("resnet18"), InvalidArgument);
}

// The published multiply-adds per 224 x 224 image (torchvision's model cards: ResNet-50 4.09 G,
// AlexNet 0.71 G, VGG-16 15.47 G), as FLOPs (2 per multiply-add), within the BatchNorm and bias
// terms forward_flops adds.
TEST(ModelShapes, ForwardFlopsMatchThePublishedCounts) {
  const auto total = [](const std::string& model) {
    double sum = 0.0;
    for (const double f : forward_flops(model)) sum += f;
    return sum;
  };
  EXPECT_NEAR(total("resnet50") / 8.18e9, 1.0, 0.02);
  EXPECT_NEAR(total("alexnet") / 1.42e9, 1.0, 0.02);
  EXPECT_NEAR(total("vgg16") / 30.94e9, 1.0, 0.02);
  EXPECT_EQ(forward_flops("cnn").size(), model_shapes("cnn").size());
}

}  // namespace
}  // namespace dgc::train
