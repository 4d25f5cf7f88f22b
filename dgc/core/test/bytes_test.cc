// The byte reader and writer every binary format uses: round trips against hand-written bytes,
// and every way a read can fail (truncated, not canonical, over its cap, left over).
#include "dgc/core/bytes.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace dgc {
namespace {

using Bytes = std::vector<uint8_t>;

DecodeError::Reason reason_of(const std::function<void()>& read) {
  try {
    read();
  } catch (const DecodeError& e) {
    return e.reason();
  }
  ADD_FAILURE() << "the read did not throw";
  return DecodeError::Reason::kBadMagic;
}

TEST(ByteWriter, IntegersAreLittleEndianWhateverTheHost) {
  Bytes out;
  ByteWriter(out).u8(0x01).u16(0x0302).u32(0x07060504).u64(0x0F0E0D0C0B0A0908).i64(-2);
  const Bytes expected = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
                          0x0D, 0x0E, 0x0F, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(out, expected);
}

TEST(ByteWriter, VarintsAndStringsAsTheFormatsLayThemOut) {
  Bytes out;
  ByteWriter(out).varint(0).varint(127).varint(128).varint(300).string("ab").raw(Bytes{9});
  const Bytes expected = {0x00, 0x7F, 0x80, 0x01, 0xAC, 0x02, 2, 0, 0, 0, 'a', 'b', 9};
  EXPECT_EQ(out, expected);
}

TEST(ByteReader, ReadsBackWhatTheWriterWrote) {
  const std::vector<uint64_t> varints = {
      0, 1, 127, 128, 16383, 16384, uint64_t{1} << 35, std::numeric_limits<uint64_t>::max()};
  Bytes bytes;
  ByteWriter out(bytes);
  out.u8(200).u16(65000).u32(4000000000u).u64(uint64_t{1} << 60).i64(-123456789);
  for (uint64_t v : varints) out.varint(v);
  out.string("").string("key").raw(Bytes{1, 2, 3});

  ByteReader in(bytes, "test buffer");
  EXPECT_EQ(in.u8("a"), 200);
  EXPECT_EQ(in.u16("b"), 65000);
  EXPECT_EQ(in.u32("c"), 4000000000u);
  EXPECT_EQ(in.u64("d"), uint64_t{1} << 60);
  EXPECT_EQ(in.i64("e"), -123456789);
  for (uint64_t v : varints) EXPECT_EQ(in.varint("v"), v);
  EXPECT_EQ(in.string(0, "empty"), "");
  EXPECT_EQ(in.string(3, "key"), "key");
  const auto raw = in.raw(3, "raw");
  EXPECT_EQ(Bytes(raw.begin(), raw.end()), (Bytes{1, 2, 3}));
  EXPECT_EQ(in.remaining(), 0u);
  EXPECT_NO_THROW(in.expect_end());
}

TEST(ByteReader, EveryTruncationThrowsNamingTheBufferFieldAndOffset) {
  const Bytes bytes = {1, 2, 3};
  ByteReader in(bytes, "frame of rank 3");
  EXPECT_EQ(in.u16("op"), 0x0201);
  try {
    in.u32("length");
    FAIL() << "read past the end";
  } catch (const DecodeError& e) {
    EXPECT_EQ(e.reason(), DecodeError::Reason::kTruncated);
    EXPECT_STREQ(
        e.what(),
        "frame of rank 3 is truncated or corrupt: length needs 4 bytes at offset 2, has 1");
  }
  EXPECT_EQ(in.offset(), 2u) << "a failed read consumes nothing";
  for (size_t size = 0; size < 8; ++size) {
    const Bytes shorter(size, 0);
    EXPECT_EQ(reason_of([&] { ByteReader(shorter, "b").u64("x"); }),
              DecodeError::Reason::kTruncated);
  }
  EXPECT_EQ(reason_of([&] {
              ByteReader(Bytes{0x80, 0x80}, "b").varint("x");
            }),
            DecodeError::Reason::kTruncated);
  EXPECT_EQ(reason_of([&] {
              ByteReader(Bytes{5, 0, 0, 0, 'a'}, "b").string(10, "x");
            }),
            DecodeError::Reason::kTruncated);
  EXPECT_EQ(reason_of([&] { ByteReader(Bytes{1}, "b").raw(2, "x"); }),
            DecodeError::Reason::kTruncated);
}

TEST(ByteReader, OnlyCanonicalSixtyFourBitVarintsAreAccepted) {
  // Overlong: 0 written in two bytes; 1 in three.
  EXPECT_EQ(reason_of([] {
              ByteReader(Bytes{0x80, 0x00}, "b").varint("x");
            }),
            DecodeError::Reason::kMalformed);
  EXPECT_EQ(reason_of([] {
              ByteReader(Bytes{0x81, 0x80, 0x00}, "b").varint("x");
            }),
            DecodeError::Reason::kMalformed);
  // Ten bytes whose last carries more than bit 63; eleven bytes.
  Bytes too_big(9, 0xFF);
  too_big.push_back(0x02);
  EXPECT_EQ(reason_of([&] { ByteReader(too_big, "b").varint("x"); }),
            DecodeError::Reason::kMalformed);
  Bytes too_long(10, 0x80);
  too_long.push_back(0x01);
  EXPECT_EQ(reason_of([&] { ByteReader(too_long, "b").varint("x"); }),
            DecodeError::Reason::kMalformed);
  // The largest value is accepted, and the unchecked reader agrees on it.
  Bytes max(9, 0xFF);
  max.push_back(0x01);
  EXPECT_EQ(ByteReader(max, "b").varint("x"), std::numeric_limits<uint64_t>::max());
  const uint8_t* p = max.data();
  EXPECT_EQ(get_varint_unchecked(p), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(p, max.data() + max.size());
}

TEST(ByteReader, AStringOverItsCapIsRefusedBeforeItIsRead) {
  Bytes bytes;
  ByteWriter(bytes).u32(0xFFFFFFFFu);  // announces 4 GiB, holds nothing
  try {
    ByteReader(bytes, "store request").string(1024, "key");
    FAIL() << "accepted a 4 GiB key";
  } catch (const DecodeError& e) {
    EXPECT_EQ(e.reason(), DecodeError::Reason::kOutOfRange);
    EXPECT_STREQ(e.what(),
                 "store request: key at offset 0 is 4294967295 bytes long, over the limit of 1024");
  }
}

TEST(ByteReader, BytesLeftOverAreMalformed) {
  const Bytes bytes = {1, 2, 3};
  ByteReader in(bytes, "handshake");
  in.u8("version");
  try {
    in.expect_end();
    FAIL() << "accepted trailing bytes";
  } catch (const DecodeError& e) {
    EXPECT_EQ(e.reason(), DecodeError::Reason::kMalformed);
    EXPECT_STREQ(e.what(), "handshake: 2 unexpected byte(s) at offset 1 after the last field");
  }
}

}  // namespace
}  // namespace dgc
