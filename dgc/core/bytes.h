// Little-endian integers, LEB128 varints and length-prefixed strings in byte buffers: the one
// byte reader and writer of every binary format in dgc (the exchange message's codec, the
// exchange handshake, the TCP store's frames, checkpoints, the rendezvous tags, the fuzz
// targets' inputs). The wire is little-endian whatever the host.
//
// Two levels:
//   - store_le / load_le / put_varint / get_varint on raw pointers, for the hot loops that
//     check bounds once for a whole record (the codec);
//   - ByteWriter (appends to a std::vector<uint8_t>) and ByteReader (reads a span, checking
//     every read), for everything else. A ByteReader never reads outside its span: every read
//     either succeeds or throws dgc::DecodeError (kTruncated when the bytes run out, kMalformed
//     for a varint that is not canonical, kOutOfRange for a string longer than its cap), with a
//     message naming the buffer, the field and the offset. Callers that own a more specific
//     error (a checkpoint's DataError) catch it at their boundary.
// Not thread-safe; no allocation beyond the writer's vector and the strings returned.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dgc/core/error.h"

namespace dgc {

// A LEB128 varint of a 64-bit value takes at most 10 bytes.
inline constexpr size_t kMaxVarintBytes = 10;

namespace detail {
template <typename T>
T swap_bytes(T value) {
  using U = std::make_unsigned_t<T>;
  U in = static_cast<U>(value), out = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    out = static_cast<U>((out << 8) | ((in >> (8 * i)) & 0xFF));
  return static_cast<T>(out);
}
}  // namespace detail

// Writes `value` at p[0, sizeof(T)) little-endian.
template <typename T>
void store_le(uint8_t* p, T value) {
  static_assert(std::is_integral_v<T>);
  if constexpr (std::endian::native == std::endian::big) value = detail::swap_bytes(value);
  std::memcpy(p, &value, sizeof(T));
}

// Reads a little-endian T from p[0, sizeof(T)).
template <typename T>
T load_le(const uint8_t* p) {
  static_assert(std::is_integral_v<T>);
  T value;
  std::memcpy(&value, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) value = detail::swap_bytes(value);
  return value;
}

// Writes x as a LEB128 varint at p (room for kMaxVarintBytes); returns the end.
inline uint8_t* put_varint(uint8_t* p, uint64_t x) {
  while (x >= 0x80) {
    *p++ = static_cast<uint8_t>(x) | 0x80;
    x >>= 7;
  }
  *p++ = static_cast<uint8_t>(x);
  return p;
}

enum class VarintRead { kOk, kTruncated, kNotCanonical };

// Reads a canonical LEB128 varint of at most 64 bits (no overlong encoding, nothing past bit
// 63) from [p, end). On kOk, `out` holds it and p points past it; otherwise p is unspecified
// inside [p, end] and the caller reports the failure.
inline VarintRead get_varint(const uint8_t*& p, const uint8_t* end, uint64_t& out) {
  uint64_t result = 0;
  for (size_t i = 0; i < kMaxVarintBytes; ++i) {
    if (p == end) return VarintRead::kTruncated;
    const uint8_t byte = *p++;
    if (i == kMaxVarintBytes - 1 && byte > 1) return VarintRead::kNotCanonical;  // > 64 bits
    result |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
    if ((byte & 0x80) == 0) {
      if (byte == 0 && i > 0) return VarintRead::kNotCanonical;  // overlong
      out = result;
      return VarintRead::kOk;
    }
  }
  return VarintRead::kNotCanonical;
}

// Reads a varint that get_varint has already accepted (a validated message): no bounds or
// canonical-form checks.
inline uint64_t get_varint_unchecked(const uint8_t*& p) {
  uint64_t x = 0;
  for (int shift = 0;; shift += 7) {
    const uint8_t byte = *p++;
    x |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) return x;
  }
}

// Appends to a byte vector the caller owns (and must keep alive while the writer is used).
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}

  template <typename T>
  ByteWriter& le(T value) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    store_le(out_.data() + at, value);
    return *this;
  }
  ByteWriter& u8(uint8_t v) { return le(v); }
  ByteWriter& u16(uint16_t v) { return le(v); }
  ByteWriter& u32(uint32_t v) { return le(v); }
  ByteWriter& u64(uint64_t v) { return le(v); }
  ByteWriter& i64(int64_t v) { return le(v); }
  ByteWriter& varint(uint64_t v) {
    uint8_t buffer[kMaxVarintBytes];
    return raw({buffer, static_cast<size_t>(put_varint(buffer, v) - buffer)});
  }
  // The bytes as they are, no length.
  ByteWriter& raw(std::span<const uint8_t> bytes) {
    if (bytes.empty()) return *this;
    const size_t at = out_.size();
    out_.resize(at + bytes.size());
    std::memcpy(out_.data() + at, bytes.data(), bytes.size());
    return *this;
  }
  ByteWriter& raw(std::string_view bytes) {
    return raw({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  }
  // A u32 length, then the bytes. Throws dgc::InvalidArgument over 4 GiB - 1.
  ByteWriter& string(std::string_view s) {
    DGC_CHECK_LE(s.size(), uint64_t{UINT32_MAX}, "a string's length must fit its u32 prefix");
    return u32(static_cast<uint32_t>(s.size())).raw(s);
  }
  size_t size() const { return out_.size(); }

 private:
  std::vector<uint8_t>& out_;
};

// Reads a span the caller owns (and must keep alive while the reader and the spans it returned
// are used). `what` names the buffer in errors, e.g. "checkpoint runs/ck.step20.rank0".
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string what)
      : bytes_(bytes), what_(std::move(what)) {}

  template <typename T>
  T le(const char* field) {
    need(sizeof(T), field);
    const T value = load_le<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return value;
  }
  uint8_t u8(const char* field) { return le<uint8_t>(field); }
  uint16_t u16(const char* field) { return le<uint16_t>(field); }
  uint32_t u32(const char* field) { return le<uint32_t>(field); }
  uint64_t u64(const char* field) { return le<uint64_t>(field); }
  int64_t i64(const char* field) { return le<int64_t>(field); }

  uint64_t varint(const char* field) {
    const uint8_t* p = bytes_.data() + pos_;
    uint64_t value = 0;
    switch (get_varint(p, bytes_.data() + bytes_.size(), value)) {
      case VarintRead::kOk:
        pos_ = static_cast<size_t>(p - bytes_.data());
        return value;
      case VarintRead::kTruncated:
        fail(DecodeError::Reason::kTruncated, field, "runs past the end");
      case VarintRead::kNotCanonical:
        break;
    }
    fail(DecodeError::Reason::kMalformed, field, "is not a canonical 64-bit varint");
  }

  // The next n bytes, as a view into the reader's span.
  std::span<const uint8_t> raw(uint64_t n, const char* field) {
    need(n, field);
    const auto out = bytes_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return out;
  }

  // A u32 length, then that many bytes; a length over max_bytes is refused before anything is
  // allocated (kOutOfRange).
  std::string string(uint64_t max_bytes, const char* field) {
    const uint32_t n = u32(field);
    if (n > max_bytes) {
      throw DecodeError(DecodeError::Reason::kOutOfRange,
                        detail::concat(what_, ": ", field, " at offset ", pos_ - 4, " is ", n,
                                       " bytes long, over the limit of ", max_bytes));
    }
    const auto bytes = raw(n, field);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  size_t offset() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  // Throws kMalformed if anything is left.
  void expect_end() const {
    if (remaining() != 0) {
      throw DecodeError(DecodeError::Reason::kMalformed,
                        detail::concat(what_, ": ", remaining(), " unexpected byte(s) at offset ",
                                       pos_, " after the last field"));
    }
  }

 private:
  void need(uint64_t n, const char* field) const {
    if (n > remaining()) {
      throw DecodeError(DecodeError::Reason::kTruncated,
                        detail::concat(what_, " is truncated or corrupt: ", field, " needs ", n,
                                       " bytes at offset ", pos_, ", has ", remaining()));
    }
  }
  [[noreturn]] void fail(DecodeError::Reason reason, const char* field, const char* problem) const {
    throw DecodeError(reason,
                      detail::concat(what_, ": ", field, " at offset ", pos_, " ", problem));
  }

  std::span<const uint8_t> bytes_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace dgc
