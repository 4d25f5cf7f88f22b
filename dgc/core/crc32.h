// CRC-32 (zlib's, the IEEE polynomial) of a byte range of any length: the one checksum of wire
// messages, checkpoints and corpus caches. Pure function; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace dgc {

uint32_t crc32_of(const void* data, size_t size);

inline uint32_t crc32_of(std::span<const uint8_t> bytes) {
  return crc32_of(bytes.data(), bytes.size());
}
inline uint32_t crc32_of(std::string_view bytes) { return crc32_of(bytes.data(), bytes.size()); }

}  // namespace dgc
