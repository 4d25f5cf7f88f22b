// The checkpoint file format: named records (text or raw arrays) in one file, written atomically.
//
// Layout (little endian): magic "DGCCKPT\0" | version u32 | record count u32 | records |
// crc32 of everything before it (u32). Record: name length u32 | name | dtype length u32 | dtype |
// rank u32 | dims i64 * rank | byte length u64 | bytes. dtype is "text" for text records, else a
// tensor element type name ("float32", "int64", ...). What the records mean is up to the writer
// (see Trainer in trainer.h for the training run's records).
//
// Not thread-safe; one object per thread.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dgc/exchange/exchange.h"

namespace dgc::train {

inline constexpr uint32_t kCheckpointVersion = 1;

struct CheckpointRecord {
  std::string dtype;  // "text" or an element type name
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

class CheckpointFile {
 public:
  void put_text(const std::string& name, const std::string& text);
  void put_array(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                 const void* data, size_t bytes);
  void put_floats(const std::string& name, std::span<const float> values);

  bool has(const std::string& name) const { return records_.count(name) != 0; }
  // Throw dgc::DataError naming the file (as given to read) when the record is missing or has
  // another dtype / size.
  const CheckpointRecord& get(const std::string& name) const;
  std::string text(const std::string& name) const;
  void get_floats(const std::string& name, std::span<float> out) const;
  const std::map<std::string, CheckpointRecord>& records() const { return records_; }

  // Writes to `path` atomically: a temporary file next to it ("<path>.tmp"), flushed and
  // fsync'ed, renamed over `path`, then the directory fsync'ed so that the rename survives a
  // power loss. Throws dgc::DataError on any I/O failure (the old file is left as it was).
  void write(const std::string& path) const;
  // Reads the file and parses it (parse). Throws dgc::DataError.
  static CheckpointFile read(const std::string& path);

  // The file's bytes (what write() puts in the file).
  std::vector<uint8_t> serialize() const;
  // Parses a checkpoint's bytes: validates magic, version, checksum and every length before
  // using it. `path` names the source in messages and becomes path(). Throws dgc::DataError.
  static CheckpointFile parse(std::span<const uint8_t> bytes, const std::string& path);

  // The path the records were read from ("" for a file built in memory); used in messages.
  const std::string& path() const { return path_; }

 private:
  std::map<std::string, CheckpointRecord> records_;
  std::string path_;
};

// Records of one number: byte counters (ExchangeBytes) and integers as text, doubles as exact
// hexadecimal text ("%a"). The readers throw dgc::DataError naming the file and the record when it
// is missing or malformed.
std::string bytes_text(const ExchangeBytes& bytes);
ExchangeBytes read_bytes(const CheckpointFile& file, const std::string& name);
int64_t read_int(const CheckpointFile& file, const std::string& name);
std::string double_text(double value);
double read_double(const CheckpointFile& file, const std::string& name);

// A training run's checkpoints are sets of per-rank files named by the step (the optimizer
// iteration) after which they were written: "<prefix>.step<step>.rank<rank>". The prefix may hold
// a directory ("runs/a/ckpt"); the files lie in that directory.
std::string checkpoint_path(const std::string& prefix, int64_t step, int rank);
// The steps of this rank's checkpoint files under `prefix` that exist now, ascending (only names
// of exactly that form count; temporary files do not). Empty when the directory is missing.
std::vector<int64_t> checkpoint_steps(const std::string& prefix, int rank);
// After this rank wrote the checkpoint of step `written` (and every rank did): deletes this
// rank's files of steps after `written` (left by a run this one was resumed from, at an earlier
// step) and all but the newest `keep` files up to `written` (keep 0: none of those). Returns the
// steps deleted. Throws dgc::DataError when a file cannot be removed.
std::vector<int64_t> remove_old_checkpoints(const std::string& prefix, int rank, int64_t written,
                                            int keep);

// "KEY=VALUE" lines of two settings texts: every key that differs, described for a message and
// joined by "; " ("setting 'density' is 0.001 in the checkpoint but 0.01 now"), or "" when they
// are equal. All of them, because one flag can change two keys (--selection-scope global drops
// dense_path_density and adds selection_scope), and the one to name is not always the first.
std::string describe_settings_difference(const std::string& stored, const std::string& current);

}  // namespace dgc::train
