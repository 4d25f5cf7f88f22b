#!/usr/bin/env python3
"""Writes the seed corpus of the codec fuzz target (fuzz/corpus/codec/) in the wire format of
dgc/core/codec.h, version 2. Run it again after a codec version change:

    python3 fuzz/make_codec_corpus.py fuzz/corpus/codec

Each seed is one options byte (see fuzz/codec_fuzz.cc: bit 0 repairs checksums and tag, bits 1-2
pick the receiver's layout, bit 3 validates with an expectation under the fuzz key) followed by a
message.
"""
import hashlib
import hmac
import os
import struct
import sys
import zlib

VERSION = 2
FLAG_BAD_GRADIENT = 1
FLAG_TAGGED = 2
FUZZ_KEY = bytes([0x42]) * 32  # codec_fuzz.cc's fuzz_key()
FUZZ_ROUTE = struct.pack("<II", 1, 0xFFFFFFFF)  # sender 1, every rank


def message(payload_hex, tensor_count, *, value_type=0, flags=0, iteration=0,
            run_id=bytes(16), magic=b"DGC1", version=VERSION, tag=None):
    payload = bytes.fromhex(payload_hex)
    header = magic + struct.pack("<BBHQII", version, value_type, flags, iteration, tensor_count,
                                 len(payload))
    header += struct.pack("<I", zlib.crc32(payload)) + run_id
    header += struct.pack("<I", zlib.crc32(header))
    body = header + payload
    if tag == "valid":
        body += hmac.new(FUZZ_KEY, FUZZ_ROUTE + body, hashlib.sha256).digest()
    elif tag == "zero":
        body += bytes(32)
    return body


SEEDS = {
    # name: (options, message)
    "bad_magic": (0, b"XGC1" + bytes(45)),
    "bf16_bad_gradient": (0, message("00010100c03f", 1, value_type=2, flags=FLAG_BAD_GRADIENT,
                                     iteration=1)),
    "empty": (0, message("", 0, iteration=7)),
    "empty_entry": (0, message("03802000", 1, iteration=2)),
    "fix_checksums": (1, message("02ac02020a090000803f00000040", 1, iteration=3)),
    "fp16": (0, message("010503010001003c00b80034", 1, value_type=1, iteration=9)),
    "fp32_two_tensors": (0, message(
        "02ac02030004a5020000003f0000a0bf0000404003802001ff1f00000040", 2, iteration=3)),
    "layout3_large_index": (6, message("02f0a20401efa2040000803f", 1, iteration=4)),
    # Version 2: job identity and the tag.
    "run_id": (0, message("02ac02020a090000803f00000040", 1, iteration=5,
                          run_id=bytes(range(1, 17)))),
    "tagged_expected": (8, message("02ac02020a090000803f00000040", 1, iteration=11,
                                   flags=FLAG_TAGGED, tag="valid")),
    "tagged_fix": (9, message("02ac02030004a5020000003f0000a0bf0000404003802001ff1f00000040", 2,
                              iteration=3, flags=FLAG_TAGGED, tag="zero")),
    "untagged_expected": (8, message("03802000", 1, iteration=2)),
    "version1": (0, message("", 0, version=1)),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                            "corpus", "codec")
    os.makedirs(out, exist_ok=True)
    for name, (options, body) in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([options]) + body)


if __name__ == "__main__":
    main()
