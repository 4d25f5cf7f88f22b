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

// Upper bound on the decompressed size of one idx file: Fashion-MNIST's training images are
// 47 MB; a file that inflates past this is not a data set this reader is for.
constexpr size_t kMaxFileBytes = size_t{1} << 32;

// The whole content of a gzip (or plain) file; every failure is an error naming the file.
std::vector<uint8_t> read_gz_file(const std::string& path) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) fail(path, errno != 0 ? std::strerror(errno) : "gzopen failed");
  std::vector<uint8_t> bytes;
  size_t size = 0;
  for (;;) {
    bytes.resize(size + (size_t{1} << 20));
    const int got = gzread(file, bytes.data() + size, 1u << 20);
    if (got < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      fail(path, "corrupt data: " + message);
    }
    if (got == 0) {
      // The end, or a gzip stream cut short (zlib reports that as Z_BUF_ERROR).
      int code = Z_OK;
      const std::string message = gzerror(file, &code);
      if (code != Z_OK) {
        gzclose(file);
        fail(path, "corrupt or truncated gzip data: " + message);
      }
      break;
    }
    size += static_cast<size_t>(got);
    if (size > kMaxFileBytes) {
      gzclose(file);
      fail(path, detail::concat("the file is larger than ", kMaxFileBytes,
                                " bytes uncompressed; it is not an idx file of a data set"));
    }
  }
  gzclose(file);
  bytes.resize(size);
  return bytes;
}

// Reads the header fields of an idx file in order (big-endian u32s).
class IdxHeader {
 public:
  IdxHeader(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint32_t next() {
    if (bytes_.size() - pos_ < 4) {
      fail(name_, detail::concat("file is truncated: it ends inside the header (", bytes_.size(),
                                 " bytes)"));
    }
    const uint8_t* b = bytes_.data() + pos_;
    pos_ += 4;
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  // The data after the header, which must be exactly `size` bytes.
  std::span<const uint8_t> data(uint64_t size, const char* what) const {
    const uint64_t left = bytes_.size() - pos_;
    if (left < size) {
      fail(name_, detail::concat("file is truncated: it ends inside the ", what, " (", left, " of ",
                                 size, " bytes)"));
    }
    if (left > size) fail(name_, "file has bytes after the data its header announces");
    return bytes_.subspan(pos_);
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  size_t pos_ = 0;
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
  const std::vector<uint8_t> images = read_gz_file(images_path);
  const std::vector<uint8_t> labels = read_gz_file(labels_path);
  return parse_idx(images, labels, images_path, labels_path, num_classes);
}

ImageSet parse_idx(std::span<const uint8_t> images, std::span<const uint8_t> labels,
                   const std::string& images_name, const std::string& labels_name,
                   int num_classes) {
  ImageSet set;
  {
    IdxHeader header(images, images_name);
    const uint32_t magic = header.next();
    if (magic != kImagesMagic) {
      fail(images_name, detail::concat("not an idx3 image file: magic 0x", std::hex, magic,
                                       ", expected 0x", kImagesMagic));
    }
    set.count = checked_dimension(images_name, header.next(), kMaxCount, "image count");
    set.rows = checked_dimension(images_name, header.next(), kMaxSide, "row count");
    set.cols = checked_dimension(images_name, header.next(), kMaxSide, "column count");
    // At most 1e8 * 4096 * 4096 < 2^64: the product does not overflow.
    const auto pixels =
        header.data(static_cast<uint64_t>(set.count) * static_cast<uint64_t>(set.rows * set.cols),
                    "pixel data");
    set.pixels.assign(pixels.begin(), pixels.end());
  }
  {
    IdxHeader header(labels, labels_name);
    const uint32_t magic = header.next();
    if (magic != kLabelsMagic) {
      fail(labels_name, detail::concat("not an idx1 label file: magic 0x", std::hex, magic,
                                       ", expected 0x", kLabelsMagic));
    }
    const int64_t count = checked_dimension(labels_name, header.next(), kMaxCount, "label count");
    if (count != set.count) {
      fail(labels_name, detail::concat("has ", count, " labels but ", images_name, " has ",
                                       set.count, " images"));
    }
    const auto data = header.data(static_cast<uint64_t>(count), "label data");
    set.labels.assign(data.begin(), data.end());
    for (size_t i = 0; i < set.labels.size(); ++i) {
      if (set.labels[i] >= num_classes) {
        fail(labels_name, detail::concat("label ", int{set.labels[i]}, " of example ", i,
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
