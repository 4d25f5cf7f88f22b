// The image classification task: Fashion-MNIST (data.h) with the models of models.h, softmax
// cross-entropy, and test accuracy / test loss as metrics.
//
// Data order: one permutation of the (first train_examples) training images per epoch, a function
// of (seed, epoch), cut into disjoint per-rank batches by EpochPlan. Evaluation: rank r takes test
// examples r, r + N, ... of the first test_examples; sums are allreduced.
#pragma once

#include "dgc/train/data.h"
#include "dgc/train/task.h"

namespace dgc::train {

class ImageTask : public Task {
 public:
  ImageTask(ImageSet train_set, ImageSet test_set);

  std::string name() const override { return "image"; }
  std::string item_unit() const override { return "ex"; }
  std::string headline() const override { return "test_accuracy"; }
  std::string settings(const TrainOptions& options) const override;
  std::unique_ptr<TaskWorker> make_worker(const TrainOptions& options, int rank,
                                          int world_size) const override;

  const ImageSet& train_set() const { return train_set_; }
  const ImageSet& test_set() const { return test_set_; }

 private:
  ImageSet train_set_;
  ImageSet test_set_;
};

// The image task's defaults: the shared ones (TaskDefaults), its model the default CNN.
TaskDefaults image_task_defaults();

// Loads the training and test sets of Fashion-MNIST from `directory` (see load_fashion_mnist).
std::unique_ptr<ImageTask> load_image_task(const std::string& directory);

}  // namespace dgc::train
