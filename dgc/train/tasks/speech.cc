#include "dgc/train/tasks/speech.h"

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <torch/nn/utils/rnn.h>
#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/data.h"
#include "dgc/train/trainer.h"

namespace dgc::train {
namespace {

class SpeechWorker : public TaskWorker {
 public:
  SpeechWorker(const SpeechTask& task, const TrainOptions& options, int rank, int world)
      : task_(task),
        options_(options),
        rank_(rank),
        world_(world),
        train_count_(
            used_count(static_cast<int64_t>(task.corpus().train.size()), options.train_examples)),
        test_count_(
            used_count(static_cast<int64_t>(task.corpus().test.size()), options.test_examples)),
        plan_{train_count_, world, options.batch_size} {
    if (options.model != "gru") {
      throw InvalidArgument("the speech task has one model, gru; got model '" + options.model +
                            "'");
    }
    if (plan_.iterations() < 1) {
      throw InvalidArgument(detail::concat("too few training utterances (", train_count_, ") for ",
                                           world, " workers x batch size ", options.batch_size,
                                           ": use more --train-examples (0 = all) or a larger "
                                           "--corpus-train, or a smaller --batch-size"));
    }
    const SpeechOptions& o = task.options();
    model_ = std::make_shared<GruCtcModel>(o.hidden, o.layers, o.stack, options.seed);
  }

  torch::nn::Module& model() override { return *model_; }
  int64_t iterations_per_epoch() const override { return plan_.iterations(); }

  void begin_epoch(int epoch) override {
    order_ = epoch_permutation(train_count_, options_.seed, epoch);
  }

  BatchLoss train_batch(int64_t iteration) override {
    const auto [begin, end] = plan_.range(rank_, iteration);
    const auto& corpus = task_.corpus();
    std::vector<torch::Tensor> features;
    std::vector<std::vector<int32_t>> targets;
    for (int64_t i = begin; i < end; ++i) {
      const auto u = static_cast<size_t>(order_[static_cast<size_t>(i)]);
      features.push_back(corpus.train_features[u]);
      targets.push_back(corpus.train[u].tokens);
    }
    const auto [log_probs, steps] = model_->forward(features);
    return {ctc_loss(log_probs, steps, targets), end - begin};
  }

  std::vector<Metric> evaluate(comm::Communicator& comm, comm::Timeout timeout) override {
    torch::NoGradGuard no_grad;
    model_->eval();
    const auto& corpus = task_.corpus();
    std::vector<std::vector<int32_t>> references;
    std::vector<torch::Tensor> clean, noisy;
    for (int64_t i = rank_; i < test_count_; i += world_) {
      references.push_back(corpus.test[static_cast<size_t>(i)].tokens);
      clean.push_back(corpus.test_features[static_cast<size_t>(i)]);
      noisy.push_back(corpus.noisy_test_features[static_cast<size_t>(i)]);
    }
    std::vector<float> sums;
    for (const auto* set : {&clean, &noisy}) {
      const auto c = count_errors(*model_, *set, references, options_.eval_batch_size);
      sums.insert(sums.end(),
                  {static_cast<float>(c.token_errors), static_cast<float>(c.reference_tokens),
                   static_cast<float>(c.utterance_errors), static_cast<float>(c.utterances)});
    }
    model_->train();
    comm.allreduce_sum(sums, timeout);
    std::vector<Metric> metrics;
    const char* names[] = {"test", "noisy_test"};
    const char* texts[] = {"test", "noisy test"};
    for (int k = 0; k < 2; ++k) {
      const double ter = sums[4 * k] / std::max(1.0f, sums[4 * k + 1]);
      const double uer = sums[4 * k + 2] / std::max(1.0f, sums[4 * k + 3]);
      metrics.push_back({std::string(names[k]) + "_token_error_rate", ter,
                         std::string(texts[k]) + format_number(" TER %.2f%%", 100.0 * ter)});
      metrics.push_back(
          {std::string(names[k]) + "_utterance_error_rate", uer,
           std::string(texts[k]) + format_number(" utterance error rate %.2f%%", 100.0 * uer)});
    }
    return metrics;
  }

 private:
  const SpeechTask& task_;
  TrainOptions options_;
  int rank_;
  int world_;
  int64_t train_count_;
  int64_t test_count_;
  EpochPlan plan_;
  std::shared_ptr<GruCtcModel> model_;
  std::vector<int64_t> order_;
};

}  // namespace

GruCtcModel::GruCtcModel(int64_t hidden, int64_t layers, int64_t stack, uint64_t seed)
    : stack_(stack) {
  DGC_CHECK_GE(hidden, 1, "GRU hidden size");
  DGC_CHECK_GE(layers, 1, "GRU layers");
  DGC_CHECK_GE(stack, 1, "frames stacked");
  gru_ = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(speech::kBands * stack, hidden)
                                                   .num_layers(layers)
                                                   .bidirectional(true)));
  output_ = register_module("output", torch::nn::Linear(2 * hidden, speech::kSymbols));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  const double gru_bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (auto& p : gru_->parameters()) p.uniform_(-gru_bound, gru_bound, generator);
  const double output_bound = 1.0 / std::sqrt(static_cast<double>(2 * hidden));
  for (auto& p : output_->parameters()) p.uniform_(-output_bound, output_bound, generator);
}

std::pair<torch::Tensor, torch::Tensor> GruCtcModel::forward(
    const std::vector<torch::Tensor>& features) {
  DGC_CHECK(!features.empty(), "an empty batch");
  const auto batch = static_cast<int64_t>(features.size());
  std::vector<int64_t> steps(features.size());
  int64_t longest = 1;
  for (size_t b = 0; b < features.size(); ++b) {
    steps[b] = std::max<int64_t>(1, (features[b].size(0) + stack_ - 1) / stack_);
    longest = std::max(longest, steps[b]);
  }
  // [longest * stack, batch, 40], zero-padded, then stacked to [longest, batch, 40 * stack].
  auto input = torch::zeros({longest * stack_, batch, speech::kBands});
  for (size_t b = 0; b < features.size(); ++b) {
    const int64_t frames = features[b].size(0);
    if (frames > 0) input.select(1, static_cast<int64_t>(b)).slice(0, 0, frames).copy_(features[b]);
  }
  input = input.view({longest, stack_, batch, speech::kBands})
              .permute({0, 2, 1, 3})
              .reshape({longest, batch, stack_ * speech::kBands});
  const auto lengths = torch::tensor(steps, torch::kInt64);
  const auto packed = torch::nn::utils::rnn::pack_padded_sequence(input, lengths,
                                                                  /*batch_first=*/false,
                                                                  /*enforce_sorted=*/false);
  auto [out, hidden] = gru_->forward_with_packed_input(packed);
  (void)hidden;
  auto [padded, padded_lengths] =
      torch::nn::utils::rnn::pad_packed_sequence(out, /*batch_first=*/false, 0.0, longest);
  (void)padded_lengths;
  return {torch::log_softmax(output_->forward(padded), 2), lengths};
}

torch::Tensor ctc_loss(const torch::Tensor& log_probs, const torch::Tensor& steps,
                       const std::vector<std::vector<int32_t>>& targets) {
  std::vector<int64_t> flat;
  std::vector<int64_t> lengths;
  for (const auto& t : targets) {
    flat.insert(flat.end(), t.begin(), t.end());
    lengths.push_back(static_cast<int64_t>(t.size()));
  }
  return torch::ctc_loss(log_probs, torch::tensor(flat, torch::kInt64), steps,
                         torch::tensor(lengths, torch::kInt64), speech::kBlank, at::Reduction::Mean,
                         /*zero_infinity=*/true);
}

std::vector<int32_t> greedy_decode(const torch::Tensor& log_probs, int64_t steps) {
  DGC_CHECK(log_probs.dim() == 2 && steps <= log_probs.size(0), "greedy_decode takes [steps, ",
            speech::kSymbols, "] and at most as many steps as rows");
  const auto best = log_probs.slice(0, 0, steps).argmax(1).contiguous();
  const int64_t* b = best.data_ptr<int64_t>();
  std::vector<int32_t> out;
  int64_t previous = -1;
  for (int64_t t = 0; t < steps; ++t) {
    if (b[t] != previous && b[t] != speech::kBlank) out.push_back(static_cast<int32_t>(b[t]));
    previous = b[t];
  }
  return out;
}

int64_t edit_distance(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diagonal = row[0];
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

ErrorCounts count_errors(GruCtcModel& model, const std::vector<torch::Tensor>& features,
                         const std::vector<std::vector<int32_t>>& references, int64_t batch) {
  DGC_CHECK(features.size() == references.size(), "one reference per utterance");
  DGC_CHECK_GE(batch, 1, "evaluation batch size");
  torch::NoGradGuard no_grad;
  ErrorCounts counts;
  for (size_t begin = 0; begin < features.size(); begin += static_cast<size_t>(batch)) {
    const size_t end = std::min(features.size(), begin + static_cast<size_t>(batch));
    const std::vector<torch::Tensor> part(features.begin() + static_cast<std::ptrdiff_t>(begin),
                                          features.begin() + static_cast<std::ptrdiff_t>(end));
    const auto [log_probs, steps] = model.forward(part);
    for (size_t b = 0; b < part.size(); ++b) {
      const auto decoded = greedy_decode(log_probs.select(1, static_cast<int64_t>(b)),
                                         steps[static_cast<int64_t>(b)].item<int64_t>());
      const auto& reference = references[begin + b];
      const int64_t errors = edit_distance(decoded, reference);
      counts.token_errors += static_cast<double>(errors);
      counts.reference_tokens += static_cast<double>(reference.size());
      counts.utterance_errors += errors > 0 ? 1.0 : 0.0;
      counts.utterances += 1.0;
    }
  }
  return counts;
}

SpeechTask::SpeechTask(speech::Corpus corpus, const SpeechOptions& options)
    : corpus_(std::move(corpus)), options_(options) {
  DGC_CHECK_GE(options_.hidden, 1, "GRU hidden size");
  DGC_CHECK_GE(options_.layers, 1, "GRU layers");
  DGC_CHECK_GE(options_.stack, 1, "frames stacked");
  DGC_CHECK(!corpus_.train.empty() && !corpus_.test.empty(), "an empty speech corpus");
}

std::string SpeechTask::settings(const TrainOptions& options) const {
  std::ostringstream out;
  out << "task=speech\n"
      << "corpus_seed=" << options_.corpus.seed << "\n"
      << "corpus_train=" << options_.corpus.train_utterances << "\n"
      << "corpus_test=" << options_.corpus.test_utterances << "\n"
      << "train_examples="
      << used_count(static_cast<int64_t>(corpus_.train.size()), options.train_examples) << "\n"
      << "test_examples="
      << used_count(static_cast<int64_t>(corpus_.test.size()), options.test_examples) << "\n"
      << "gru_hidden=" << options_.hidden << "\n"
      << "gru_layers=" << options_.layers << "\n"
      << "frame_stack=" << options_.stack << "\n";
  return out.str();
}

std::unique_ptr<TaskWorker> SpeechTask::make_worker(const TrainOptions& options, int rank,
                                                    int world_size) const {
  return std::make_unique<SpeechWorker>(*this, options, rank, world_size);
}

TaskDefaults speech_task_defaults() {
  const TaskDefaults shared = shared_task_defaults();
  return {.model = "gru",
          .epochs = 10,
          .batch_size = 4,
          .lr = 0.25,
          .weight_decay = 0.0,
          .clip_norm = 1.0,
          .masking = shared.masking,
          .selection_scope = shared.selection_scope};
}

std::unique_ptr<SpeechTask> load_speech_task(SpeechOptions options, bool progress) {
  if (progress && !options.corpus.progress) {
    const bool terminal = isatty(fileno(stderr)) != 0;
    const std::string dir = speech::corpus_dir(options.corpus);
    auto last = std::make_shared<int64_t>(-1);
    options.corpus.progress = [terminal, dir, last](int64_t done, int64_t total) {
      // On a terminal one line redrawn; otherwise a line per 10%.
      const int64_t tenth = total > 0 ? done * 10 / total : 10;
      if (!terminal && tenth == *last && done != total) return;
      *last = tenth;
      std::fprintf(
          stderr, "%sspeech corpus: synthesising %lld / %lld utterances with espeak-ng into %s%s",
          terminal ? "\r" : "", static_cast<long long>(done), static_cast<long long>(total),
          dir.c_str(), terminal && done != total ? "" : "\n");
      std::fflush(stderr);
    };
  }
  auto corpus = speech::load_corpus(options.corpus);
  return std::make_unique<SpeechTask>(std::move(corpus), options);
}

}  // namespace dgc::train
