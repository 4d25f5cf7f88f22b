// The Fashion-MNIST reader (parse_idx in dgc/train/data.h) on the bytes of an image file and a
// label file.
//
// Input: one byte whose low 4 bits + 1 are the number of classes, two bytes (little endian) that
// give the length of the image file (cut to what is there), the image file, then the label file.
//
// Promises checked: parsing throws nothing but dgc::DataError, and never allocates more than the
// input holds (a header that announces more data than follows is rejected first; ASan's
// allocation limit and -rss_limit_mb catch the rest); an accepted set has count * rows * cols
// pixels, count labels, each below the number of classes, and its pixels are the file's bytes.
#include <algorithm>
#include <cstring>
#include <optional>

#include "dgc/core/error.h"
#include "dgc/train/data.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int classes = (data[0] & 15) + 1;
  const size_t image_bytes = std::min<size_t>(size - 3, data[1] | (size_t{data[2]} << 8));
  const std::span<const uint8_t> images(data + 3, image_bytes);
  const std::span<const uint8_t> labels(data + 3 + image_bytes, size - 3 - image_bytes);

  std::optional<dgc::train::ImageSet> set;
  if (!dgc::fuzz::accepted<dgc::DataError>([&] {
        set.emplace(dgc::train::parse_idx(images, labels, "images", "labels", classes));
      })) {
    return 0;
  }
  FUZZ_CHECK(set->count >= 1 && set->rows >= 1 && set->cols >= 1, "empty dimensions");
  FUZZ_CHECK(set->pixels.size() == static_cast<size_t>(set->count * set->image_size()),
             "%zu pixels", set->pixels.size());
  FUZZ_CHECK(set->labels.size() == static_cast<size_t>(set->count), "%zu labels",
             set->labels.size());
  FUZZ_CHECK(images.size() == 16 + set->pixels.size() &&
                 std::memcmp(images.data() + 16, set->pixels.data(), set->pixels.size()) == 0,
             "pixels are not the file's bytes");
  for (uint8_t label : set->labels) FUZZ_CHECK(label < classes, "label %d", int{label});
  return 0;
}
