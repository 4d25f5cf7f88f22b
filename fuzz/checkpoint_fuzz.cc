// The checkpoint reader (dgc/train/checkpoint.h) on a file's bytes.
//
// Input: one byte of options, then the file. Option bit 0 set: the trailing checksum is
// recomputed before parsing, so that mutations reach the record parser.
//
// Promises checked: parsing throws nothing but dgc::DataError; an accepted file serializes to
// bytes that parse to the same records; every record reads back through text() / get_floats()
// when its dtype and size say it can, and get_floats() of the wrong size is a DataError.
#include <zlib.h>

#include <optional>
#include <vector>

#include "dgc/core/bytes.h"
#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "fuzz/fuzz_check.h"

namespace {

using dgc::DataError;
using dgc::train::CheckpointFile;

void fix_checksum(std::vector<uint8_t>& file) {
  if (file.size() < 4) return;
  const size_t body = file.size() - 4;
  const auto crc =
      static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), file.data(), static_cast<uInt>(body)));
  dgc::store_le<uint32_t>(file.data() + body, crc);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> file(data + 1, data + size);
  if (data[0] & 1) fix_checksum(file);

  std::optional<CheckpointFile> parsed;
  if (!dgc::fuzz::accepted<DataError>(
          [&] { parsed.emplace(CheckpointFile::parse(file, "fuzz-input")); })) {
    return 0;
  }
  const CheckpointFile again = CheckpointFile::parse(parsed->serialize(), "serialized");
  FUZZ_CHECK(again.records().size() == parsed->records().size(), "%zu records, then %zu",
             parsed->records().size(), again.records().size());
  for (const auto& entry : parsed->records()) {
    const std::string& name =
        entry.first;  // named: structured bindings cannot be captured in C++20
    const auto& record = entry.second;
    FUZZ_CHECK(again.has(name), "record '%s' lost", name.c_str());
    const auto& copy = again.get(name);
    FUZZ_CHECK(copy.dtype == record.dtype && copy.shape == record.shape && copy.data == record.data,
               "record '%s' changed through serialize", name.c_str());
    if (record.dtype == "text") {
      FUZZ_CHECK(parsed->text(name).size() == record.data.size(), "text of '%s'", name.c_str());
    } else {
      FUZZ_CHECK(!dgc::fuzz::accepted<DataError>([&] { parsed->text(name); }),
                 "text() of a %s record", record.dtype.c_str());
    }
    if (record.dtype == "float32" && record.data.size() % 4 == 0) {
      std::vector<float> values(record.data.size() / 4);
      parsed->get_floats(name, values);
    }
    std::vector<float> wrong(record.data.size() / 4 + 1);
    FUZZ_CHECK(!dgc::fuzz::accepted<DataError>([&] { parsed->get_floats(name, wrong); }),
               "get_floats of the wrong size for '%s'", name.c_str());
  }
  return 0;
}
