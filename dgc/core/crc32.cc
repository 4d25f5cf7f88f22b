#include "dgc/core/crc32.h"

#include <zlib.h>

#include <algorithm>

namespace dgc {

uint32_t crc32_of(const void* data, size_t size) {
  const auto* bytes = static_cast<const Bytef*>(data);
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed in chunks.
  size_t done = 0;
  while (done < size) {
    const size_t n = std::min<size_t>(size - done, size_t{1} << 30);
    crc = crc32(crc, bytes + done, static_cast<uInt>(n));
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace dgc
