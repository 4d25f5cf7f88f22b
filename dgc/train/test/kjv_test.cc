// The KJV corpus: tokenization, the cache (prepared once, validated on every read, refused with a
// clear message when corrupt, a missing `bible` program named with its package), the fixed split,
// the vocabulary and <unk>. Every test uses its own temporary cache directory.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dgc/core/error.h"
#include "dgc/train/tasks/kjv.h"

namespace dgc::train::kjv {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("dgc_kjv_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected dgc::DataError";
  return "";
}

TEST(Tokenize, LowerCasesAndDropsPunctuation) {
  EXPECT_EQ(tokenize("In the beginning God created the heaven and the earth."),
            (std::vector<std::string>{"in", "the", "beginning", "god", "created", "the", "heaven",
                                      "and", "the", "earth"}));
  EXPECT_EQ(tokenize("the LORD's house; (Beth-el) fathers' 'twas 12 tribes!?"),
            (std::vector<std::string>{"the", "lord's", "house", "beth", "el", "fathers", "twas",
                                      "12", "tribes"}));
  EXPECT_TRUE(tokenize("  ,;: ' -- ").empty());
}

TEST(Split, IsFixedBlocksOfFiftyVerses) {
  EXPECT_EQ(part_of(0), Part::kTrain);
  EXPECT_EQ(part_of(899), Part::kTrain);
  EXPECT_EQ(part_of(900), Part::kValidation);
  EXPECT_EQ(part_of(949), Part::kValidation);
  EXPECT_EQ(part_of(950), Part::kTest);
  EXPECT_EQ(part_of(999), Part::kTest);
  EXPECT_EQ(part_of(1000), Part::kTrain);
  EXPECT_EQ(part_of(1900), Part::kValidation);
  int64_t counts[3] = {0, 0, 0};
  for (int64_t v = 0; v < kVerses; ++v) ++counts[static_cast<int>(part_of(v))];
  EXPECT_EQ(counts[0] + counts[1] + counts[2], kVerses);
  for (int p = 1; p < 3; ++p) {
    EXPECT_GT(counts[p], kVerses / 25) << to_string(static_cast<Part>(p));  // > 4%
    EXPECT_LT(counts[p], kVerses / 16) << to_string(static_cast<Part>(p));  // < 6.25%
  }
}

TEST(Vocabulary, KeepsTheMostFrequentTrainingWordsAndMapsTheRestToUnk) {
  // Verses 0..899 are training verses; 900 is validation and must not count.
  std::vector<std::string> verses(901, "");
  verses[0] = "b a a c";
  verses[1] = "a b d";
  verses[2] = "c e";
  verses[900] = "zebra zebra zebra zebra zebra";
  const auto vocabulary = build_vocabulary(verses, 5);  // <unk> <eos> + 3 words
  EXPECT_EQ(vocabulary.words, (std::vector<std::string>{"<unk>", "<eos>", "a", "b", "c"}));
  EXPECT_EQ(vocabulary.id("a"), 2);
  EXPECT_EQ(vocabulary.id("d"), kUnk) << "rare training word";
  EXPECT_EQ(vocabulary.id("zebra"), kUnk) << "validation words are not counted";
  EXPECT_EQ(encode(verses, vocabulary, Part::kTrain, 3),
            (std::vector<int32_t>{3, 2, 2, 4, kEos, 2, 3, kUnk, kEos, 4, kUnk, kEos}));
  int64_t used = 0;
  EXPECT_EQ(encode(verses, vocabulary, Part::kValidation, 0, &used),
            (std::vector<int32_t>{kUnk, kUnk, kUnk, kUnk, kUnk, kEos}));
  EXPECT_EQ(used, 1);
  EXPECT_THROW(build_vocabulary(verses, 2), InvalidArgument);
}

class Corpus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(temp_dir("prepared"));
    verses_ = new std::vector<std::string>(load_verses(dir_->string()));
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_->parent_path());
    delete dir_;
    delete verses_;
  }
  static inline fs::path* dir_ = nullptr;
  static inline std::vector<std::string>* verses_ = nullptr;
};

TEST_F(Corpus, IsPreparedOnceDeterministicallyAndReadBack) {
  ASSERT_EQ(static_cast<int64_t>(verses_->size()), kVerses);
  EXPECT_EQ(verses_->front(), "in the beginning god created the heaven and the earth");
  EXPECT_EQ(verses_->back(), "the grace of our lord jesus christ be with you all amen");
  // Prepared again elsewhere: the same bytes. Read again: the same verses.
  const auto other = temp_dir("again");
  EXPECT_EQ(load_verses(other.string()), *verses_);
  EXPECT_EQ(read_file(other / kCorpusFile), read_file(*dir_ / kCorpusFile));
  EXPECT_EQ(load_verses(dir_->string()), *verses_);

  const auto a = build_vocabulary(*verses_, 5000);
  const auto b = build_vocabulary(*verses_, 5000);
  EXPECT_EQ(a.words, b.words);
  EXPECT_EQ(a.size(), 5000);
  EXPECT_EQ(a.words[2], "the") << "the most frequent word";
  const auto stream = encode(*verses_, a, Part::kTrain);
  EXPECT_EQ(stream, encode(*verses_, b, Part::kTrain));
  int64_t unk = 0;
  for (const int32_t id : stream) unk += id == kUnk ? 1 : 0;
  EXPECT_GT(unk, 0) << "5000 words do not cover the KJV";
  EXPECT_LT(static_cast<double>(unk) / static_cast<double>(stream.size()), 0.05);
}

TEST_F(Corpus, ACorruptCacheIsRefusedWithWhatToDelete) {
  const auto good = read_file(*dir_ / kCorpusFile);
  const auto dir = temp_dir("corrupt");
  const auto path = dir / kCorpusFile;
  std::string flipped = good;
  flipped[flipped.size() / 2] = flipped[flipped.size() / 2] == 'a' ? 'b' : 'a';
  for (const auto& bad :
       {flipped, good.substr(0, good.size() / 3), std::string("garbage\n"), std::string("")}) {
    write_file(path, bad);
    const auto message = error_of([&] { load_verses(dir.string()); });
    EXPECT_NE(message.find("is corrupt"), std::string::npos) << message;
    EXPECT_NE(message.find("delete it"), std::string::npos) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  }
  // Deleted: prepared again.
  fs::remove(path);
  EXPECT_EQ(load_verses(dir.string()), *verses_);
}

TEST(CorpusPreparation, AMissingBibleProgramNamesThePackage) {
  const auto dir = temp_dir("nobible");
  const auto message =
      error_of([&] { load_verses(dir.string(), (dir / "no-such-bible").string()); });
  EXPECT_NE(message.find("bible-kjv"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir / kCorpusFile)) << "nothing half-written is left behind";
  // A program that prints something else is refused too.
  const auto fake = dir / "fake-bible";
  write_file(fake, "#!/bin/sh\necho 'not a bible'\n");
  fs::permissions(fake, fs::perms::owner_all);
  const auto other = error_of([&] { load_verses(dir.string(), fake.string()); });
  EXPECT_NE(other.find("bible-kjv"), std::string::npos) << other;
  EXPECT_FALSE(fs::exists(dir / kCorpusFile));
}

TEST(CorpusPreparation, DefaultCacheDirFollowsXdgThenHome) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_xdg = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
  EXPECT_EQ(default_cache_dir(), "/somewhere/cache/dgc");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') {
    EXPECT_EQ(default_cache_dir(), (fs::path(home) / ".cache" / "dgc").string());
  }
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
}

}  // namespace
}  // namespace dgc::train::kjv
