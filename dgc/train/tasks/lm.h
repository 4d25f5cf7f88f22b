// The language-modelling task: a word-level 2-layer LSTM on the King James Bible (kjv.h),
// softmax cross-entropy over the next word, validation and test perplexity as metrics.
//
// Model (LstmLanguageModel): embedding [V, E] -> dropout -> LSTM layer 1 (E -> H) -> dropout ->
// LSTM layer 2 (H -> H) -> dropout -> decoder [V, H] (no bias, untied). Each LSTM layer has
// weight_ih [4H, in], weight_hh [4H, H] and one bias [4H] (gates i, f, g, o). Parameters:
// V*E + V*H + 4H*(E+H+1) + 4H*(2H+1); the defaults (V = 5000, E = H = 100) give
// 1,160,800. Only the two LSTM biases (800 floats) are 1-D: with the existing policy they go
// dense and everything else is compressed. The decoder has no bias on purpose: a [V] bias would
// be a dense tensor of V floats in every message, more than the compressed tensors at d = 0.001.
//
// Data: the training stream (first train_examples training verses, each followed by <eos>) is cut
// into N equal contiguous parts, rank r reading part r. Each rank lays its part out as batch_size
// columns (column b = the b-th contiguous piece) and reads bptt rows per iteration; the hidden
// state is carried from one batch to the next (truncated back-propagation through time) and
// reset to zero at the start of every epoch. Dropout masks come from a generator seeded from
// (seed, rank, epoch), so an epoch is a function of (weights, seed, rank, epoch) and resume is
// exact. Iterations per epoch = floor((part / batch_size - 1) / bptt), the same on every rank.
//
// Evaluation: the validation and test streams (first test_examples verses of each) are cut the
// same way into N parts of batch_size columns each, read in bptt rows with the state carried;
// the summed negative log-likelihood and token count are allreduced, and
// perplexity = exp(sum / count).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>

#include "dgc/train/options.h"
#include "dgc/train/task.h"
#include "dgc/train/tasks/kjv.h"

namespace dgc::train {

class CheckpointFile;

struct LmOptions {
  std::string cache_dir;        // where the prepared corpus lives; "" = kjv::default_cache_dir()
  std::string bible = "bible";  // the program that prints the KJV (Debian package bible-kjv)
  int64_t vocabulary = 5000;    // V, including <unk> and <eos>
  int64_t embedding = 100;      // E
  int64_t hidden = 100;         // H
  int64_t bptt = 35;            // tokens per sequence of a batch (truncated BPTT length)
  double dropout = 0.2;         // probability of zeroing an activation (training only)
};

// The lm task's defaults (TaskDefaults): the model lstm, and the shared options that differ for
// it, with the paper's gradient clipping for RNNs on. lr 5 with momentum
// 0.9: on 4,000 verses, 3 epochs, 4 workers, dense reached test perplexity 108 at lr 5 against
// 259 at lr 1 (batch 10), and 149 at lr 10 against 185 at lr 5 (batch 20).
// Momentum factor masking is off: zeroing u where v was sent throws away the momentum's future
// contribution to every element that is sent often (an element sent every T steps keeps about
// (T - m (1 - m^T) / (1 - m)) / T of it: 19% at T = 3, 41% at T = 10): every element during
// the density warm-up, and afterwards the ones selected most often. On the full corpus,
// 3 epochs, 4 workers: test perplexity 67.1 without masking against 78.5 with it (dense 57.4);
// on the full schedule 42.8 against 43.3 (dense 40.2; docs/training.md). --masking turns it on.
// Selection is global (one threshold over the whole model, SelectionScope::kGlobal): on the full
// schedule (30 epochs, 4 workers, seeds 1-3) test perplexity 38.85 / 38.52 / 38.98 against
// 39.01 / 39.16 / 39.34 per tensor (dense 37.87 / 38.34 / 38.18: +1.7% on average against
// +2.7%), at 697x after warm-up against 663x. --selection-scope tensor is the paper's.
TaskDefaults lm_task_defaults();

// One LSTM layer over a whole sequence [T, B, in] -> [T, B, H].
class LstmLayer : public torch::nn::Module {
 public:
  LstmLayer(int64_t input_size, int64_t hidden_size);
  // state: (h, c), each [B, H]; replaced by the state after the last step.
  torch::Tensor forward(const torch::Tensor& input, std::array<torch::Tensor, 2>& state);

  torch::Tensor weight_ih, weight_hh, bias;
};

class LstmLanguageModel : public torch::nn::Module {
 public:
  using State = std::array<std::array<torch::Tensor, 2>, 2>;  // per layer: (h, c)

  // Weights drawn from a generator seeded with `seed` (no global state): embedding and decoder
  // uniform(-0.1, 0.1), LSTM tensors uniform(-1/sqrt(H), 1/sqrt(H)).
  LstmLanguageModel(int64_t vocabulary, int64_t embedding, int64_t hidden, double dropout,
                    uint64_t seed);

  // tokens [T, B] int64 -> logits [T * B, V] (row t * B + b). `state` is carried (and replaced).
  // Dropout applies in training mode only, with masks drawn from `generator`.
  torch::Tensor forward(const torch::Tensor& tokens, State& state, at::Generator& generator);
  State initial_state(int64_t batch) const;

  int64_t vocabulary() const { return vocabulary_; }

 private:
  torch::Tensor dropout(const torch::Tensor& x, at::Generator& generator);

  int64_t vocabulary_;
  int64_t hidden_;
  double dropout_;
  torch::Tensor embedding_;
  std::shared_ptr<LstmLayer> layer1_, layer2_;
  torch::Tensor decoder_;
};

class LmTask : public Task {
 public:
  // `verses`: the tokenized corpus (kjv::load_verses).
  LmTask(const std::vector<std::string>& verses, const LmOptions& options);

  std::string name() const override { return "lm"; }
  std::string item_unit() const override { return "tokens"; }
  std::string headline() const override { return "test_perplexity"; }
  std::string settings(const TrainOptions& options) const override;
  std::unique_ptr<TaskWorker> make_worker(const TrainOptions& options, int rank,
                                          int world_size) const override;

  const LmOptions& options() const { return options_; }
  const kjv::Vocabulary& vocabulary() const { return vocabulary_; }
  // The token stream of the first `limit` verses of `part` (all when limit <= 0); `verses`, when
  // given, receives how many verses that is.
  std::vector<int32_t> stream(kjv::Part part, int64_t limit, int64_t* verses = nullptr) const;

 private:
  LmOptions options_;
  kjv::Vocabulary vocabulary_;
  std::array<std::vector<int32_t>, 3> streams_;     // by kjv::Part
  std::array<std::vector<int64_t>, 3> verse_ends_;  // end offset of every verse in streams_
};

// Loads the corpus (preparing the cache on first use) and builds the task.
std::unique_ptr<LmTask> load_lm_task(const LmOptions& options);

// Per-word analysis of a trained model (`dgc lm-words`).
//
// The loss of every target token of `part` (its first `limit` verses, all when limit <= 0), the
// stream cut into `world` parts of `batch_size` columns and read with the state carried exactly
// as a training run of `world` workers evaluates it (LmWorker::evaluate), so that
// exp(mean of nll) is that run's perplexity of the part.
struct TokenLosses {
  std::vector<int32_t> targets;  // the id of each predicted token
  std::vector<double> nll;       // its negative log-likelihood under the model
};
TokenLosses token_losses(const LmTask& task, LstmLanguageModel& model, kjv::Part part,
                         int64_t limit, int world, int64_t batch_size);

// A range of vocabulary ids. Ids are frequency ranks: id 1 + k is the k-th most frequent word of
// the training split (kjv::build_vocabulary), so a range of ids is a band of word frequency.
struct WordBand {
  std::string name;  // "<eos>", "words 1-10", ..., "<unk>"
  int32_t first_id;
  int32_t last_id;  // inclusive
};
// <eos>, the words of frequency rank 1-10, 11-100, 101-1,000 and so on up to the vocabulary's
// last word, then <unk>. Together they cover every id of a vocabulary of `size` once.
std::vector<WordBand> frequency_bands(int64_t size);

// The parameters of a training checkpoint ("model/param/NAME" records, Trainer's files; every
// rank holds the same weights) copied into `model`. Throws dgc::DataError naming the file when
// a parameter is missing or has another shape (a checkpoint of another model or size).
void load_model_parameters(const CheckpointFile& file, torch::nn::Module& model);

}  // namespace dgc::train
