// The speech-recognition task: a bidirectional GRU acoustic model trained with CTC on spoken
// letters and digits synthesised by espeak-ng (speech_corpus.h), the paper's third task
// (DeepSpeech on AN4) at a size two CPU cores can train.
//
// Model (GruCtcModel): the 40 log-mel features of `stack` consecutive 10 ms frames are stacked
// into one input vector (stride `stack`, so a step is 30 ms by default and the sequence a third as
// long; the last step is padded with zeros), then `layers` bidirectional GRU layers of `hidden`
// units per direction (libtorch's GRU, weight_ih [3H, in], weight_hh [3H, H], bias_ih and bias_hh
// [3H] per direction and layer), then a linear layer [37, 2H] + bias to the 37 symbols (blank,
// a-z, 0-9). Defaults (stack 3, 3 layers, H = 128): 794,405 parameters, of which 13 2-D tensors
// (789,760 values) are compressed and the 13 biases (4,645 values) take the dense path.
//
// Loss: torch::ctc_loss over the log-softmax of the outputs, blank 0, the mean over the batch of
// each utterance's loss divided by its transcript length (reduction mean), infinite losses (an
// utterance too short for its transcript) zeroed. Batches are padded to their longest utterance
// and packed with their lengths, so padding never enters the GRU nor the loss.
//
// Data: the training utterances (the first train_examples; all when 0) in a permutation per
// epoch from (seed, epoch), dealt to the ranks as the image task does (EpochPlan); an epoch is a
// function of (weights, seed, rank, epoch), so resume is exact with no state of its own.
//
// Evaluation: greedy decoding (the most likely symbol per step, repeats collapsed, blanks
// dropped) of the first test_examples test utterances (all when 0), clean and with noise; each
// rank takes utterances rank, rank + N, ...; the sums are allreduced. Token error rate (TER) =
// the edit distance (insertions, deletions, substitutions) between decoded and reference
// symbols, summed, over the reference symbols; utterance error rate = the share of utterances
// not decoded exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>

#include "dgc/train/task.h"
#include "dgc/train/tasks/speech_corpus.h"

namespace dgc::train {

struct SpeechOptions {
  speech::CorpusOptions corpus;
  int64_t hidden = 128;  // GRU units per direction
  int64_t layers = 3;    // bidirectional GRU layers
  int64_t stack = 3;     // frames stacked into one step (and the stride)
};

// The speech task's defaults (TaskDefaults): the model gru, and the shared options that differ
// for it, with the paper's gradient clipping for RNNs on.
TaskDefaults speech_task_defaults();

class GruCtcModel : public torch::nn::Module {
 public:
  // Weights uniform(-1/sqrt(fan), 1/sqrt(fan)) from a generator seeded with `seed` (fan: H for the
  // GRU, 2H for the output layer), as PyTorch initialises them, without global state.
  GruCtcModel(int64_t hidden, int64_t layers, int64_t stack, uint64_t seed);

  // `features`: per utterance [frames, 40]. Returns log-probabilities [steps, batch, 37] and the
  // steps of each utterance (int64 [batch]).
  std::pair<torch::Tensor, torch::Tensor> forward(const std::vector<torch::Tensor>& features);

  int64_t stack() const { return stack_; }

 private:
  int64_t stack_;
  torch::nn::GRU gru_{nullptr};
  torch::nn::Linear output_{nullptr};
};

// The CTC loss of log-probabilities [steps, batch, 37] with `steps` [batch] against `targets`
// (symbols 1..36 per utterance), as the task trains.
torch::Tensor ctc_loss(const torch::Tensor& log_probs, const torch::Tensor& steps,
                       const std::vector<std::vector<int32_t>>& targets);
// Greedy decoding of the first `steps` rows of one utterance's log-probabilities [rows, 37]:
// argmax per step, repeats collapsed, blanks dropped.
std::vector<int32_t> greedy_decode(const torch::Tensor& log_probs, int64_t steps);
// The Levenshtein distance between two symbol sequences.
int64_t edit_distance(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Errors summed over utterances; TER = token_errors / reference_tokens.
struct ErrorCounts {
  double token_errors = 0.0;
  double reference_tokens = 0.0;
  double utterance_errors = 0.0;
  double utterances = 0.0;
};
// Decodes `features` in batches of `batch` with `model` (in whatever mode it is in) and counts the
// errors against `references`.
ErrorCounts count_errors(GruCtcModel& model, const std::vector<torch::Tensor>& features,
                         const std::vector<std::vector<int32_t>>& references, int64_t batch);

class SpeechTask : public Task {
 public:
  SpeechTask(speech::Corpus corpus, const SpeechOptions& options);

  std::string name() const override { return "speech"; }
  std::string item_unit() const override { return "utt"; }
  std::string headline() const override { return "test_token_error_rate"; }
  std::string settings(const TrainOptions& options) const override;
  std::unique_ptr<TaskWorker> make_worker(const TrainOptions& options, int rank,
                                          int world_size) const override;

  const SpeechOptions& options() const { return options_; }
  const speech::Corpus& corpus() const { return corpus_; }

 private:
  speech::Corpus corpus_;
  SpeechOptions options_;
};

// Loads the corpus (generating it on first use, with progress on stderr when `progress`) and
// builds the task.
std::unique_ptr<SpeechTask> load_speech_task(SpeechOptions options, bool progress);

}  // namespace dgc::train
