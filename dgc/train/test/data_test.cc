// The Fashion-MNIST loader and the per-epoch data order.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/core/error.h"
#include "dgc/train/data.h"

namespace dgc::train {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("dgc_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<uint8_t> be32(uint32_t v) {
  return {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16),
          static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)};
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

// An idx3 image file of `count` images (header says `announced`) and a matching label file.
void write_set(const TempDir& dir, uint32_t count, uint32_t announced, uint8_t label = 3,
               uint32_t image_magic = 0x803) {
  std::vector<uint8_t> images = be32(image_magic);
  for (uint32_t v : {announced, 4u, 5u}) {
    const auto b = be32(v);
    images.insert(images.end(), b.begin(), b.end());
  }
  for (uint32_t i = 0; i < count * 20; ++i) images.push_back(static_cast<uint8_t>(i));
  std::vector<uint8_t> labels = be32(0x801);
  const auto n = be32(announced);
  labels.insert(labels.end(), n.begin(), n.end());
  for (uint32_t i = 0; i < announced; ++i) labels.push_back(label);
  write_gz(dir.file("images.gz"), images);
  write_gz(dir.file("labels.gz"), labels);
}

template <typename Fn>
std::string data_error(Fn fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected dgc::DataError";
  return "";
}

TEST(FashionMnist, LoadsTheInstalledData) {
  const auto [images, labels] = fashion_mnist_files(kDefaultDataDir, Split::kTrain);
  ASSERT_TRUE(fs::exists(images))
      << images << " is missing: install the Debian package dataset-fashion-mnist "
      << "(scripts/setup.sh does)";
  const ImageSet train = load_fashion_mnist(kDefaultDataDir, Split::kTrain);
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  ASSERT_EQ(train.pixels.size(), 60000u * 784u);
  std::vector<int> per_class(10, 0);
  for (uint8_t l : train.labels) ++per_class.at(l);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], 6000) << "class " << c;
  const ImageSet test = load_fashion_mnist(kDefaultDataDir, Split::kTest);
  EXPECT_EQ(test.count, 10000);
  const ImageSet first = head(test, 100);
  EXPECT_EQ(first.count, 100);
  EXPECT_TRUE(std::equal(first.labels.begin(), first.labels.end(), test.labels.begin()));
}

TEST(FashionMnist, MissingDirectoryNamesTheFileAndThePackage) {
  const std::string message =
      data_error([] { load_fashion_mnist("/nonexistent/dgc-data", Split::kTrain); });
  EXPECT_NE(message.find("/nonexistent/dgc-data/train-images-idx3-ubyte.gz"), std::string::npos)
      << message;
  EXPECT_NE(message.find("dataset-fashion-mnist"), std::string::npos) << message;
  EXPECT_NE(message.find("--data"), std::string::npos) << message;
}

TEST(FashionMnist, ReadsAValidSmallSet) {
  TempDir dir;
  write_set(dir, 7, 7);
  const ImageSet set = read_idx(dir.file("images.gz"), dir.file("labels.gz"));
  EXPECT_EQ(set.count, 7);
  EXPECT_EQ(set.image_size(), 20);
  EXPECT_EQ(set.pixels[21], 21);
  EXPECT_EQ(set.labels[6], 3);
}

TEST(FashionMnist, RejectsTruncatedPixelData) {
  TempDir dir;
  write_set(dir, 6, 7);  // header announces 7 images, the file has 6
  const std::string message =
      data_error([&] { read_idx(dir.file("images.gz"), dir.file("labels.gz")); });
  EXPECT_NE(message.find("images.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST(FashionMnist, RejectsATruncatedGzipStream) {
  TempDir dir;
  const auto [images, labels] = fashion_mnist_files(kDefaultDataDir, Split::kTest);
  // The first 100 KB of the real compressed file: a gzip stream cut in the middle.
  std::vector<char> bytes(100000);
  {
    FILE* in = std::fopen(images.c_str(), "rb");
    ASSERT_NE(in, nullptr) << images << " is missing: install dataset-fashion-mnist";
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), in), bytes.size());
    std::fclose(in);
    FILE* out = std::fopen(dir.file("cut.gz").c_str(), "wb");
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), out), bytes.size());
    std::fclose(out);
  }
  const std::string message = data_error([&] { read_idx(dir.file("cut.gz"), labels); });
  EXPECT_NE(message.find("cut.gz"), std::string::npos) << message;
}

TEST(FashionMnist, RejectsTrailingBytesBadMagicBadLabelsAndCountMismatch) {
  {
    TempDir dir;
    write_set(dir, 8, 7);  // one image more than announced
    EXPECT_NE(data_error([&] {
                read_idx(dir.file("images.gz"), dir.file("labels.gz"));
              }).find("after the data"),
              std::string::npos);
  }
  {
    TempDir dir;
    write_set(dir, 7, 7, 3, 0x801);
    EXPECT_NE(
        data_error([&] { read_idx(dir.file("images.gz"), dir.file("labels.gz")); }).find("magic"),
        std::string::npos);
  }
  {
    TempDir dir;
    write_set(dir, 7, 7, /*label=*/10);
    EXPECT_NE(data_error([&] {
                read_idx(dir.file("images.gz"), dir.file("labels.gz"));
              }).find("label 10"),
              std::string::npos);
  }
  {
    TempDir dir;
    write_set(dir, 7, 7);
    std::vector<uint8_t> labels = be32(0x801);
    const auto n = be32(6);
    labels.insert(labels.end(), n.begin(), n.end());
    labels.resize(labels.size() + 6, 1);
    write_gz(dir.file("labels6.gz"), labels);
    EXPECT_NE(data_error([&] {
                read_idx(dir.file("images.gz"), dir.file("labels6.gz"));
              }).find("has 6 labels"),
              std::string::npos);
  }
  {
    TempDir dir;
    write_gz(dir.file("empty.gz"), {});
    write_set(dir, 7, 7);
    EXPECT_NE(data_error([&] {
                read_idx(dir.file("empty.gz"), dir.file("labels.gz"));
              }).find("truncated"),
              std::string::npos);
  }
}

TEST(FashionMnist, RejectsAHeaderAnnouncingMoreThanTheFileHoldsBeforeAllocating) {
  // 100,000,000 images of 4096 x 4096 announced, none present: the reader used to allocate the
  // announced 1.6 PB pixel buffer first (std::bad_alloc, not a DataError). The fuzz regression
  // input fuzz/regressions/idx/huge_header is the same file.
  TempDir dir;
  std::vector<uint8_t> images = be32(0x803);
  for (uint32_t v : {100'000'000u, 4096u, 4096u}) {
    const auto b = be32(v);
    images.insert(images.end(), b.begin(), b.end());
  }
  write_gz(dir.file("huge.gz"), images);
  write_set(dir, 7, 7);
  const std::string message =
      data_error([&] { read_idx(dir.file("huge.gz"), dir.file("labels.gz")); });
  EXPECT_NE(message.find("huge.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  // The same through the byte parser, with a label file announcing as many labels.
  std::vector<uint8_t> labels = be32(0x801);
  const auto n = be32(100'000'000u);
  labels.insert(labels.end(), n.begin(), n.end());
  EXPECT_NE(data_error([&] { parse_idx(images, labels, "images", "labels"); }).find("truncated"),
            std::string::npos);
}

TEST(FashionMnist, ParsesBytesLikeTheFileReader) {
  std::vector<uint8_t> images = be32(0x803);
  for (uint32_t v : {2u, 1u, 3u}) {
    const auto b = be32(v);
    images.insert(images.end(), b.begin(), b.end());
  }
  for (uint8_t p : {1, 2, 3, 4, 5, 6}) images.push_back(p);
  std::vector<uint8_t> labels = be32(0x801);
  const auto n = be32(2);
  labels.insert(labels.end(), n.begin(), n.end());
  labels.push_back(9);
  labels.push_back(0);
  const ImageSet set = parse_idx(images, labels, "images", "labels");
  EXPECT_EQ(set.count, 2);
  EXPECT_EQ(set.image_size(), 3);
  EXPECT_EQ(set.pixels, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(set.labels, (std::vector<uint8_t>{9, 0}));
  labels.back() = 10;
  EXPECT_NE(data_error([&] { parse_idx(images, labels, "images", "labels"); }).find("label 10"),
            std::string::npos);
}

TEST(EpochPermutation, IsAPermutationFixedBySeedAndEpoch) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    const auto p = epoch_permutation(n, 7, 0);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(sorted, iota) << "n=" << n;
    EXPECT_EQ(p, epoch_permutation(n, 7, 0));
  }
  EXPECT_NE(epoch_permutation(1000, 7, 0), epoch_permutation(1000, 7, 1));
  EXPECT_NE(epoch_permutation(1000, 7, 0), epoch_permutation(1000, 8, 0));
}

TEST(EpochPlan, RanksTakeDisjointBatchesCoveringTheEpoch) {
  for (int64_t n : {1, 5, 64, 100, 1001, 6000}) {
    for (int world : {1, 2, 3, 4, 7}) {
      for (int64_t batch : {1, 4, 32}) {
        const EpochPlan plan{n, world, batch};
        const int64_t global = world * batch;
        const int64_t expected_dropped = (n % global) < world ? n % global : 0;
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (int64_t it = 0; it < plan.iterations(); ++it) {
          int64_t smallest = INT64_MAX;
          int64_t largest = 0;
          for (int rank = 0; rank < world; ++rank) {
            const auto [begin, end] = plan.range(rank, it);
            ASSERT_LE(0, begin);
            ASSERT_LE(end, n);
            ASSERT_LT(begin, end) << "every rank gets at least one example";
            smallest = std::min(smallest, end - begin);
            largest = std::max(largest, end - begin);
            for (int64_t i = begin; i < end; ++i) ++seen[static_cast<size_t>(i)];
          }
          EXPECT_LE(largest - smallest, 1);
          EXPECT_LE(largest, batch);
        }
        const auto covered = std::count(seen.begin(), seen.end(), 1);
        EXPECT_EQ(covered, n - expected_dropped) << n << " " << world << " " << batch;
        EXPECT_EQ(std::count_if(seen.begin(), seen.end(), [](int s) { return s > 1; }), 0);
      }
    }
  }
  EXPECT_THROW((EpochPlan{10, 2, 4}.range(2, 0)), InvalidArgument);
}

}  // namespace
}  // namespace dgc::train
