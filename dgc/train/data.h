// Fashion-MNIST in its idx .gz files, and the data order of a data-parallel run: one permutation
// per epoch, the same on every rank, cut into disjoint per-rank batches.
//
// No libtorch here: images stay uint8 until a batch is built (see trainer.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dgc::train {

// Where Debian's dataset-fashion-mnist package installs the files.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Mean and standard deviation of Fashion-MNIST training pixels scaled to [0, 1]; batches are
// normalised with them.
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

enum class Split : uint8_t { kTrain, kTest };

// Images and labels, row-major: image i is pixels[i*rows*cols, (i+1)*rows*cols).
struct ImageSet {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
  int64_t image_size() const { return rows * cols; }
};

// Reads an idx3 image file and its idx1 label file (gzip-compressed or plain) and parses them
// with parse_idx. Throws dgc::DataError naming the file and what was wrong, and saying to install
// dataset-fashion-mnist or pass --data.
ImageSet read_idx(const std::string& images_path, const std::string& labels_path,
                  int num_classes = 10);

// Parses the bytes of an idx3 image file and an idx1 label file (uncompressed). Validates magic
// numbers, dimensions, label range (< num_classes) and exact length before allocating anything
// the header announces. Throws dgc::DataError naming `images_name` / `labels_name` as above.
ImageSet parse_idx(std::span<const uint8_t> images, std::span<const uint8_t> labels,
                   const std::string& images_name, const std::string& labels_name,
                   int num_classes = 10);

// The files of `split` in `directory`: {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
std::pair<std::string, std::string> fashion_mnist_files(const std::string& directory, Split split);
ImageSet load_fashion_mnist(const std::string& directory, Split split);

// The first `count` examples (all when count <= 0 or count >= set.count).
ImageSet head(const ImageSet& set, int64_t count);

// A permutation of [0, n) that depends only on (seed, epoch): every rank computes the same one.
// Fisher-Yates over std::mt19937_64, so it is the same on every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// How one epoch of `n` examples is cut into iterations for `world_size` ranks of `batch_size`
// examples each. Global batch g = world_size * batch_size. Iterations 0 .. n/g - 1 give every rank
// batch_size examples; a final partial global batch of r = n % g examples is split as evenly as
// possible (sizes differ by at most one) when r >= world_size, and dropped otherwise (fewer than
// world_size examples). Ranks take disjoint ranges, so the union per epoch is the whole set (less
// the dropped remainder).
struct EpochPlan {
  int64_t examples = 0;
  int world_size = 1;
  int64_t batch_size = 1;

  int64_t iterations() const;
  // [begin, end) into the epoch's permutation for `rank` at `iteration` (< iterations()).
  std::pair<int64_t, int64_t> range(int rank, int64_t iteration) const;
};

}  // namespace dgc::train
