#include "dgc/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "dgc/core/bytes.h"
#include "dgc/core/crc32.h"
#include "dgc/core/error.h"
#include "dgc/core/key_value.h"

namespace dgc::train {
namespace {

constexpr char kMagic[8] = {'D', 'G', 'C', 'C', 'K', 'P', 'T', '\0'};
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 40;

// Names and dtypes are short; a longer one is a corrupt file, refused before it is allocated.
constexpr uint64_t kMaxNameBytes = uint64_t{1} << 20;

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void CheckpointFile::put_text(const std::string& name, const std::string& text) {
  CheckpointRecord record;
  record.dtype = "text";
  record.data.assign(text.begin(), text.end());
  records_[name] = std::move(record);
}

void CheckpointFile::put_array(const std::string& name, const std::string& dtype,
                               std::vector<int64_t> shape, const void* data, size_t bytes) {
  DGC_CHECK(dtype != "text", "record '", name, "': use put_text for text");
  CheckpointRecord record;
  record.dtype = dtype;
  record.shape = std::move(shape);
  const auto* begin = static_cast<const uint8_t*>(data);
  record.data.assign(begin, begin + bytes);
  records_[name] = std::move(record);
}

void CheckpointFile::put_floats(const std::string& name, std::span<const float> values) {
  put_array(name, "float32", {static_cast<int64_t>(values.size())}, values.data(),
            values.size_bytes());
}

const CheckpointRecord& CheckpointFile::get(const std::string& name) const {
  const auto it = records_.find(name);
  if (it == records_.end()) {
    throw DataError("checkpoint " + path_ + " has no record '" + name +
                    "': it was written by a different model or version");
  }
  return it->second;
}

std::string CheckpointFile::text(const std::string& name) const {
  const auto& record = get(name);
  if (record.dtype != "text") {
    throw DataError("checkpoint " + path_ + ": record '" + name + "' is " + record.dtype +
                    ", expected text");
  }
  return std::string(record.data.begin(), record.data.end());
}

void CheckpointFile::get_floats(const std::string& name, std::span<float> out) const {
  const auto& record = get(name);
  if (record.dtype != "float32" || record.data.size() != out.size_bytes()) {
    throw DataError(detail::concat("checkpoint ", path_, ": record '", name, "' is ", record.dtype,
                                   " of ", record.data.size(), " bytes, expected float32 of ",
                                   out.size_bytes(), " bytes"));
  }
  std::memcpy(out.data(), record.data.data(), out.size_bytes());
}

std::vector<uint8_t> CheckpointFile::serialize() const {
  std::vector<uint8_t> bytes(std::begin(kMagic), std::end(kMagic));
  ByteWriter out(bytes);
  out.u32(kCheckpointVersion).u32(static_cast<uint32_t>(records_.size()));
  for (const auto& [name, record] : records_) {
    out.string(name).string(record.dtype).u32(static_cast<uint32_t>(record.shape.size()));
    for (const int64_t dim : record.shape) out.i64(dim);
    out.u64(record.data.size()).raw(record.data);
  }
  out.u32(crc32_of(bytes));
  return bytes;
}

void CheckpointFile::write(const std::string& path) const {
  const std::vector<uint8_t> bytes = serialize();
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw DataError("cannot write checkpoint " + temporary + ": " + errno_text());
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(temporary.c_str());
      throw DataError("cannot write checkpoint " + temporary + ": " + why);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(temporary.c_str());
    throw DataError("cannot flush checkpoint " + temporary + ": " + why);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(temporary.c_str());
    throw DataError("cannot rename " + temporary + " to " + path + ": " + why);
  }
  // The rename is durable once the directory entry is on disk.
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    const std::string why = errno_text();
    if (dir_fd >= 0) ::close(dir_fd);
    throw DataError("cannot flush directory " + directory + " after writing checkpoint " + path +
                    ": " + why);
  }
  ::close(dir_fd);
}

CheckpointFile CheckpointFile::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("cannot open checkpoint " + path + ": " + errno_text() +
                    " (run without --resume to start a new run)");
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  return parse(bytes, path);
}

CheckpointFile CheckpointFile::parse(std::span<const uint8_t> bytes, const std::string& path) {
  if (bytes.size() < sizeof(kMagic) + 12 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic))) {
    throw DataError("checkpoint " + path + " is not a dgc checkpoint (bad magic or too short)");
  }
  const std::span<const uint8_t> all = bytes;
  const auto body = all.first(all.size() - 4);
  if (load_le<uint32_t>(all.last(4).data()) != crc32_of(body)) {
    throw DataError("checkpoint " + path + " is truncated or corrupt (checksum mismatch)");
  }
  try {
    ByteReader reader(body.subspan(sizeof(kMagic)), "checkpoint " + path);
    const uint32_t version = reader.u32("format version");
    if (version != kCheckpointVersion) {
      throw DataError(detail::concat("checkpoint ", path, " has format version ", version,
                                     ", this program reads version ", kCheckpointVersion));
    }
    CheckpointFile file;
    file.path_ = path;
    const uint32_t count = reader.u32("record count");
    for (uint32_t i = 0; i < count; ++i) {
      std::string name = reader.string(kMaxNameBytes, "record name");
      CheckpointRecord record;
      record.dtype = reader.string(kMaxNameBytes, "record dtype");
      const uint32_t rank = reader.u32("record rank");
      if (rank > 16) {
        throw DataError(
            detail::concat("checkpoint ", path, ": record '", name, "' has rank ", rank));
      }
      for (uint32_t d = 0; d < rank; ++d) record.shape.push_back(reader.i64("record shape"));
      const uint64_t size = reader.u64("record size");
      if (size > kMaxRecordBytes) {
        throw DataError(
            detail::concat("checkpoint ", path, ": record '", name, "' claims ", size, " bytes"));
      }
      const auto data = reader.raw(size, "record data");
      record.data.assign(data.begin(), data.end());
      file.records_[std::move(name)] = std::move(record);
    }
    if (reader.remaining() != 0) {
      throw DataError(detail::concat("checkpoint ", path, " has ", reader.remaining(),
                                     " unexpected bytes after its records"));
    }
    return file;
  } catch (const DecodeError& e) {
    throw DataError(e.what());  // a checkpoint's errors are DataErrors, with the same message
  }
}

std::string bytes_text(const ExchangeBytes& b) {
  std::ostringstream out;
  out << b.message << " " << b.dense_gradient << " " << b.wire_sent << " " << b.wire_received << " "
      << b.dense_wire_sent << " " << b.message_compressed << " " << b.message_dense_path << " "
      << b.message_headers;
  return out.str();
}

ExchangeBytes read_bytes(const CheckpointFile& file, const std::string& name) {
  std::istringstream in(file.text(name));
  ExchangeBytes b;
  if (!(in >> b.message >> b.dense_gradient >> b.wire_sent >> b.wire_received >>
        b.dense_wire_sent >> b.message_compressed >> b.message_dense_path >> b.message_headers)) {
    throw DataError("checkpoint " + file.path() + ": record '" + name + "' is malformed");
  }
  return b;
}

int64_t read_int(const CheckpointFile& file, const std::string& name) {
  const std::string text = file.text(name);
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError("checkpoint " + file.path() + ": record '" + name + "' is not an integer: '" +
                  text + "'");
}

double read_double(const CheckpointFile& file, const std::string& name) {
  const std::string text = file.text(name);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw DataError("checkpoint " + file.path() + ": record '" + name + "' is not a number: '" +
                    text + "'");
  }
  return value;
}

std::string double_text(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a", value);  // hexadecimal: exact
  return text;
}

std::string checkpoint_path(const std::string& prefix, int64_t step, int rank) {
  return prefix + ".step" + std::to_string(step) + ".rank" + std::to_string(rank);
}

std::vector<int64_t> checkpoint_steps(const std::string& prefix, int rank) {
  namespace fs = std::filesystem;
  const fs::path prefix_path(prefix);
  fs::path directory = prefix_path.parent_path();
  if (directory.empty()) directory = ".";
  const std::string head = prefix_path.filename().string() + ".step";
  const std::string tail = ".rank" + std::to_string(rank);
  std::vector<int64_t> steps;
  std::error_code error;
  fs::directory_iterator it(directory, error);
  if (error) return steps;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) break;
    const std::string name = it->path().filename().string();
    if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
        name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
      continue;
    }
    const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
    if (digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::vector<int64_t> remove_old_checkpoints(const std::string& prefix, int rank, int64_t written,
                                            int keep) {
  DGC_CHECK_GE(keep, 0, "checkpoints to keep");
  std::vector<int64_t> doomed;
  std::vector<int64_t> kept;
  for (const int64_t step : checkpoint_steps(prefix, rank)) {
    (step > written ? doomed : kept).push_back(step);
  }
  if (keep > 0 && kept.size() > static_cast<size_t>(keep)) {
    doomed.insert(doomed.end(), kept.begin(), kept.end() - keep);
  }
  std::sort(doomed.begin(), doomed.end());
  for (const int64_t step : doomed) {
    const std::string path = checkpoint_path(prefix, step, rank);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw DataError("cannot remove the old checkpoint " + path + ": " + errno_text());
    }
  }
  return doomed;
}

std::string describe_settings_difference(const std::string& stored, const std::string& current) {
  const auto a = parse_key_value_lines(stored);
  const auto b = parse_key_value_lines(current);
  std::vector<std::string> differences;
  for (const auto& [key, value] : a) {
    const auto it = b.find(key);
    if (it == b.end()) {
      differences.push_back("setting '" + key + "' is " + value +
                            " in the checkpoint but not in this run");
    } else if (it->second != value) {
      differences.push_back("setting '" + key + "' is " + value + " in the checkpoint but " +
                            it->second + " now");
    }
  }
  for (const auto& [key, value] : b) {
    if (!a.count(key)) {
      differences.push_back("setting '" + key + "' is " + value +
                            " in this run but not in the checkpoint");
    }
  }
  std::string text;
  for (const auto& difference : differences) text += (text.empty() ? "" : "; ") + difference;
  return text;
}

}  // namespace dgc::train
