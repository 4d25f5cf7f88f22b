// The checkpoint file format and the progress formatting helpers.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/progress.h"

namespace dgc::train {
namespace {

namespace fs = std::filesystem;

std::string temp_file(const std::string& name) {
  return (fs::temp_directory_path() / ("dgc_ckpt_test_" + std::to_string(::getpid()) + name))
      .string();
}

CheckpointFile sample() {
  CheckpointFile file;
  file.put_text("meta/settings", "a=1\nb=2\n");
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  file.put_floats("model/w", values);
  const int64_t ints[2] = {7, -9};
  file.put_array("model/n", "Long", {2}, ints, sizeof(ints));
  return file;
}

TEST(Checkpoint, RoundTripsRecordsAtomically) {
  const std::string path = temp_file("roundtrip");
  sample().write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const CheckpointFile file = CheckpointFile::read(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.text("meta/settings"), "a=1\nb=2\n");
  std::vector<float> w(3);
  file.get_floats("model/w", w);
  EXPECT_EQ(w, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(file.get("model/n").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(file.get("model/n").dtype, "Long");
  std::vector<float> wrong(4);
  EXPECT_THROW(file.get_floats("model/w", wrong), DataError);
  EXPECT_THROW(file.get("model/missing"), DataError);
  EXPECT_THROW(file.text("model/w"), DataError);
  fs::remove(path);
}

TEST(Checkpoint, RejectsCorruptTruncatedAndForeignFiles) {
  const std::string path = temp_file("corrupt");
  sample().write(path);
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto write_bytes = [&](const std::vector<char>& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  write_bytes(flipped);
  EXPECT_THROW(CheckpointFile::read(path), DataError);
  write_bytes(
      std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2)));
  EXPECT_THROW(CheckpointFile::read(path), DataError);
  write_bytes(std::vector<char>{'h', 'e', 'l', 'l', 'o'});
  EXPECT_THROW(CheckpointFile::read(path), DataError);
  fs::remove(path);
  try {
    CheckpointFile::read(path);
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

// Step-named files: the listing sees only this rank's "<prefix>.step<S>.rank<r>" files; removal
// keeps the newest K up to the step just written and deletes the steps after it.
TEST(Checkpoint, ListsKeepsTheNewestAndDeletesLaterSteps) {
  const auto dir = fs::path(temp_file("steps"));
  fs::create_directories(dir);
  const std::string prefix = (dir / "run").string();
  EXPECT_EQ(checkpoint_path(prefix, 40, 1), prefix + ".step40.rank1");
  EXPECT_TRUE(checkpoint_steps((dir / "missing" / "run").string(), 0).empty());
  for (const int64_t step : {5, 10, 40, 100, 7}) {
    sample().write(checkpoint_path(prefix, step, 0));
    sample().write(checkpoint_path(prefix, step, 1));
  }
  for (const char* other : {"run.step7.rank0.tmp", "run.stepab.rank0", "run.step.rank0",
                            "run.step3.rank01", "runx.step3.rank0", "run.step3.rank10"}) {
    std::ofstream(dir / other) << "x";
  }
  EXPECT_EQ(checkpoint_steps(prefix, 0), (std::vector<int64_t>{5, 7, 10, 40, 100}));
  // Written 40, keep 2: 100 is from an abandoned later branch, 5 and 7 are old.
  EXPECT_EQ(remove_old_checkpoints(prefix, 0, 40, 2), (std::vector<int64_t>{5, 7, 100}));
  EXPECT_EQ(checkpoint_steps(prefix, 0), (std::vector<int64_t>{10, 40}));
  EXPECT_EQ(checkpoint_steps(prefix, 1), (std::vector<int64_t>{5, 7, 10, 40, 100}));
  // keep 0 keeps every step up to the one written.
  EXPECT_EQ(remove_old_checkpoints(prefix, 1, 40, 0), (std::vector<int64_t>{100}));
  EXPECT_EQ(checkpoint_steps(prefix, 1), (std::vector<int64_t>{5, 7, 10, 40}));
  EXPECT_TRUE(fs::exists(dir / "run.step7.rank0.tmp"));
  fs::remove_all(dir);
}

TEST(Checkpoint, NumberRecordsRoundTripExactly) {
  CheckpointFile file;
  const double third = 1.0 / 3.0;
  file.put_text("a", double_text(third));
  file.put_text("b", double_text(-1e-310));
  file.put_text("bad", "1.5x");
  ExchangeBytes bytes;
  bytes.message = 7;
  bytes.wire_sent = uint64_t{1} << 40;
  bytes.message_headers = 3;
  file.put_text("bytes", bytes_text(bytes));
  EXPECT_EQ(read_double(file, "a"), third);
  EXPECT_EQ(read_double(file, "b"), -1e-310);
  EXPECT_THROW(read_double(file, "bad"), DataError);
  EXPECT_THROW(read_int(file, "bad"), DataError);
  const ExchangeBytes back = read_bytes(file, "bytes");
  EXPECT_EQ(back.message, 7u);
  EXPECT_EQ(back.wire_sent, uint64_t{1} << 40);
  EXPECT_EQ(back.message_headers, 3u);
}

TEST(Checkpoint, DescribesEveryDifferentSetting) {
  EXPECT_EQ(describe_settings_difference("a=1\nb=2\n", "a=1\nb=2\n"), "");
  EXPECT_EQ(describe_settings_difference("a=1\nb=2\n", "a=1\nb=3\n"),
            "setting 'b' is 2 in the checkpoint but 3 now");
  EXPECT_EQ(describe_settings_difference("a=1\n", "a=1\nc=4\n"),
            "setting 'c' is 4 in this run but not in the checkpoint");
  EXPECT_EQ(describe_settings_difference("a=1\nc=4\n", "a=1\n"),
            "setting 'c' is 4 in the checkpoint but not in this run");
  // A per-tensor checkpoint resumed with global selection: both keys, so that the message names
  // the flag that changed.
  EXPECT_EQ(describe_settings_difference("a=1\ndense_path_density=0.1\n",
                                         "a=2\nselection_scope=global\n"),
            "setting 'a' is 1 in the checkpoint but 2 now; setting 'dense_path_density' is 0.1 in "
            "the checkpoint but not in this run; setting 'selection_scope' is global in this run "
            "but not in the checkpoint");
}

TEST(Progress, FormatsBytesAndDurations) {
  EXPECT_EQ(format_bytes(812), "812 B");
  EXPECT_EQ(format_bytes(1460), "1.46 KB");
  EXPECT_EQ(format_bytes(3.2e6), "3.20 MB");
  EXPECT_EQ(format_bytes(1.1e9), "1.10 GB");
  EXPECT_EQ(format_duration(42.2), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3725), "1h02m");
}

}  // namespace
}  // namespace dgc::train
