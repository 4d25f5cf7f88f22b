#include "dgc/train/data.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>

#include "dgc/core/error.h"

namespace dgc::train {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // idx3, unsigned byte
constexpr uint32_t kLabelsMagic = 0x00000801;  // idx1, unsigned byte
constexpr uint32_t kMaxCount = 100'000'000;
constexpr uint32_t kMaxSide = 4096;

std::string hint() {
  return " (install the Debian package dataset-fashion-mnist, or pass --data DIR with the "
         "Fashion-MNIST files {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz)";
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw DataError("cannot read " + path + ": " + what + hint());
}

// A gzip (or plain) file read sequentially; every short read is an error naming the file.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      fail(path, errno != 0 ? std::strerror(errno) : "gzopen failed");
    }
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  void read(void* out, size_t bytes, const char* what) {
    auto* dst = static_cast<uint8_t*>(out);
    while (bytes > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30));
      const int got = gzread(file_, dst, chunk);
      if (got < 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        fail(path_, std::string("corrupt data while reading ") + what + ": " + message);
      }
      if (got == 0) {
        fail(path_, std::string("file is truncated: it ends inside the ") + what);
      }
      dst += got;
      bytes -= static_cast<size_t>(got);
    }
  }

  uint32_t read_u32(const char* what) {
    std::array<uint8_t, 4> b{};
    read(b.data(), b.size(), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  void expect_end() {
    uint8_t extra = 0;
    const int got = gzread(file_, &extra, 1);
    if (got < 0) {
      int code = 0;
      fail(path_, std::string("corrupt data at the end: ") + gzerror(file_, &code));
    }
    if (got != 0) fail(path_, "file has bytes after the data its header announces");
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

int64_t checked_dimension(const std::string& path, uint32_t value, uint32_t max, const char* what) {
  if (value == 0 || value > max) {
    fail(path, detail::concat("implausible ", what, " ", value, " in the header (expected 1 to ",
                              max, ")"));
  }
  return static_cast<int64_t>(value);
}

}  // namespace

ImageSet read_idx(const std::string& images_path, const std::string& labels_path, int num_classes) {
  ImageSet set;
  {
    GzFile file(images_path);
    const uint32_t magic = file.read_u32("header");
    if (magic != kImagesMagic) {
      fail(images_path, detail::concat("not an idx3 image file: magic 0x", std::hex, magic,
                                       ", expected 0x", kImagesMagic));
    }
    set.count = checked_dimension(images_path, file.read_u32("header"), kMaxCount, "image count");
    set.rows = checked_dimension(images_path, file.read_u32("header"), kMaxSide, "row count");
    set.cols = checked_dimension(images_path, file.read_u32("header"), kMaxSide, "column count");
    set.pixels.resize(static_cast<size_t>(set.count * set.rows * set.cols));
    file.read(set.pixels.data(), set.pixels.size(), "pixel data");
    file.expect_end();
  }
  {
    GzFile file(labels_path);
    const uint32_t magic = file.read_u32("header");
    if (magic != kLabelsMagic) {
      fail(labels_path, detail::concat("not an idx1 label file: magic 0x", std::hex, magic,
                                       ", expected 0x", kLabelsMagic));
    }
    const int64_t count =
        checked_dimension(labels_path, file.read_u32("header"), kMaxCount, "label count");
    if (count != set.count) {
      fail(labels_path, detail::concat("has ", count, " labels but ", images_path, " has ",
                                       set.count, " images"));
    }
    set.labels.resize(static_cast<size_t>(count));
    file.read(set.labels.data(), set.labels.size(), "label data");
    file.expect_end();
    for (size_t i = 0; i < set.labels.size(); ++i) {
      if (set.labels[i] >= num_classes) {
        fail(labels_path, detail::concat("label ", int{set.labels[i]}, " of example ", i,
                                         " is not below ", num_classes));
      }
    }
  }
  return set;
}

std::pair<std::string, std::string> fashion_mnist_files(const std::string& directory, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  std::string dir = directory.empty() ? std::string(".") : directory;
  if (dir.back() != '/') dir += '/';
  return {dir + prefix + "-images-idx3-ubyte.gz", dir + prefix + "-labels-idx1-ubyte.gz"};
}

ImageSet load_fashion_mnist(const std::string& directory, Split split) {
  const auto [images, labels] = fashion_mnist_files(directory, split);
  return read_idx(images, labels);
}

ImageSet head(const ImageSet& set, int64_t count) {
  if (count <= 0 || count >= set.count) return set;
  ImageSet out;
  out.count = count;
  out.rows = set.rows;
  out.cols = set.cols;
  out.pixels.assign(set.pixels.begin(), set.pixels.begin() + count * set.image_size());
  out.labels.assign(set.labels.begin(), set.labels.begin() + count);
  return out;
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  DGC_CHECK_GE(n, 0, "example count");
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  // Distinct, well-mixed stream per (seed, epoch).
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32), 0x44474331u};
  std::mt19937_64 rng(seq);
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased bounded draw (rejection), so the order is the same on every platform.
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r = rng();
    while (r >= limit) r = rng();
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(r % bound)]);
  }
  return order;
}

int64_t EpochPlan::iterations() const {
  DGC_CHECK_GE(world_size, 1, "world size");
  DGC_CHECK_GE(batch_size, 1, "batch size");
  const int64_t global = world_size * batch_size;
  const int64_t remainder = examples % global;
  return examples / global + (remainder >= world_size ? 1 : 0);
}

std::pair<int64_t, int64_t> EpochPlan::range(int rank, int64_t iteration) const {
  DGC_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " of ", world_size);
  DGC_CHECK(iteration >= 0 && iteration < iterations(), "iteration ", iteration, " of ",
            iterations());
  const int64_t global = world_size * batch_size;
  const int64_t full = examples / global;
  if (iteration < full) {
    const int64_t begin = iteration * global + rank * batch_size;
    return {begin, begin + batch_size};
  }
  const int64_t remainder = examples - full * global;
  const int64_t part = remainder / world_size;
  const int64_t extra = remainder % world_size;
  const int64_t begin = full * global + rank * part + std::min<int64_t>(rank, extra);
  return {begin, begin + part + (rank < extra ? 1 : 0)};
}

}  // namespace dgc::train
