// The language-model task (lm.h): its data (the KJV split into per-rank columns), its worker
// (truncated backpropagation through time, perplexity) and the word-frequency analysis of
// `dgc lm-words`. The model itself is in lm_model.cc.
#include "dgc/train/tasks/lm.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>

#include <torch/torch.h>

#include "dgc/core/error.h"
#include "dgc/train/checkpoint.h"
#include "dgc/train/trainer.h"

namespace dgc::train {
namespace {

// A per-(seed, rank, epoch) stream for dropout masks.
uint64_t dropout_seed(uint64_t seed, int rank, int epoch) {
  uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1)) ^
               (0xC2B2AE3D27D4EB4Full * static_cast<uint64_t>(epoch + 1));
  x ^= x >> 31;
  return x;
}

// Part `rank` of `world` equal contiguous parts of `stream`, laid out as [rows, columns]:
// column b holds the b-th contiguous piece of the part.
torch::Tensor rank_columns(const std::vector<int32_t>& stream, int rank, int world,
                           int64_t columns) {
  const int64_t part = static_cast<int64_t>(stream.size()) / world;
  const int64_t rows = part / columns;
  auto out = torch::empty({rows, columns}, torch::kInt64);
  int64_t* data = out.data_ptr<int64_t>();
  const int64_t start = part * rank;
  for (int64_t b = 0; b < columns; ++b) {
    for (int64_t t = 0; t < rows; ++t) {
      data[t * columns + b] = stream[static_cast<size_t>(start + b * rows + t)];
    }
  }
  return out;
}

// "[5000, 100]"
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return text + "]";
}

// Runs `model` in evaluation mode over `data` ([rows, columns], one rank's part of a stream),
// `bptt` rows at a time with the state carried from the first row to the last, and hands each
// piece's logits and targets (every row but the first is a target once) to `consume`. Training
// mode is restored afterwards.
void evaluate_columns(
    LstmLanguageModel& model, const torch::Tensor& data, int64_t bptt, at::Generator& generator,
    const std::function<void(const torch::Tensor& logits, const torch::Tensor& target)>& consume) {
  torch::NoGradGuard no_grad;
  const bool training = model.is_training();
  model.eval();
  auto state = model.initial_state(data.size(1));
  for (int64_t row = 0; row + 1 < data.size(0); row += bptt) {
    const int64_t length = std::min(bptt, data.size(0) - 1 - row);
    const auto logits = model.forward(data.slice(0, row, row + length), state, generator);
    consume(logits, data.slice(0, row + 1, row + 1 + length).reshape({-1}));
  }
  model.train(training);
}

class LmWorker : public TaskWorker {
 public:
  LmWorker(const LmTask& task, const TrainOptions& options, int rank, int world)
      : task_(task),
        options_(options),
        rank_(rank),
        world_(world),
        generator_(at::make_generator<at::CPUGeneratorImpl>(dropout_seed(options.seed, rank, 0))) {
    if (options.model != "lstm") {
      throw InvalidArgument("the lm task has one model, lstm; got model '" + options.model + "'");
    }
    const LmOptions& lm = task.options();
    int64_t verses = 0;
    const auto train = task.stream(kjv::Part::kTrain, options.train_examples, &verses);
    train_ = rank_columns(train, rank, world, options.batch_size);
    iterations_ = train_.size(0) > 0 ? (train_.size(0) - 1) / lm.bptt : 0;
    if (iterations_ < 1) {
      throw InvalidArgument(
          detail::concat("too few training tokens (", train.size(), " in ", verses, " verses) for ",
                         world, " workers x batch size ", options.batch_size, " x bptt ", lm.bptt,
                         ": use more --train-examples, or a smaller --batch-size or --bptt"));
    }
    for (const auto part : {kjv::Part::kValidation, kjv::Part::kTest}) {
      const auto stream = task.stream(part, options.test_examples, &verses);
      auto columns = rank_columns(stream, rank, world, options.batch_size);
      if (columns.size(0) < 2) {
        throw InvalidArgument(detail::concat("too few ", kjv::to_string(part), " tokens (",
                                             stream.size(), " in ", verses, " verses) for ", world,
                                             " workers x batch size ", options.batch_size,
                                             ": use more --test-examples (0 = all)"));
      }
      eval_[part == kjv::Part::kValidation ? 0 : 1] = columns;
    }
    model_ = std::make_shared<LstmLanguageModel>(task.vocabulary().size(), lm.embedding, lm.hidden,
                                                 lm.dropout, options.seed);
    state_ = model_->initial_state(options.batch_size);
  }

  torch::nn::Module& model() override { return *model_; }
  int64_t iterations_per_epoch() const override { return iterations_; }

  void begin_epoch(int epoch) override {
    state_ = model_->initial_state(options_.batch_size);
    generator_ =
        at::make_generator<at::CPUGeneratorImpl>(dropout_seed(options_.seed, rank_, epoch));
  }

  BatchLoss train_batch(int64_t iteration) override {
    const int64_t bptt = task_.options().bptt;
    const int64_t row = iteration * bptt;
    const auto input = train_.slice(0, row, row + bptt);
    const auto target = train_.slice(0, row + 1, row + 1 + bptt).reshape({-1});
    // Truncated BPTT: the state carries over, the graph does not.
    for (auto& layer : state_) {
      for (auto& t : layer) t = t.detach();
    }
    const auto logits = model_->forward(input, state_, generator_);
    return {torch::nn::functional::cross_entropy(logits, target), target.numel()};
  }

  // Mid-epoch state: the carried LSTM state (h, c of both layers) and the dropout generator.
  void save_state(CheckpointFile& file) const override {
    for (size_t layer = 0; layer < state_.size(); ++layer) {
      for (size_t part = 0; part < 2; ++part) {
        const auto t = state_[layer][part].detach().contiguous();
        file.put_array(state_record(layer, part), "float32", t.sizes().vec(), t.data_ptr(),
                       t.nbytes());
      }
    }
    at::Tensor generator_state;
    {
      std::lock_guard<std::mutex> lock(generator_.mutex());
      generator_state = generator_.get_state();
    }
    file.put_array("task/dropout_generator", "uint8", generator_state.sizes().vec(),
                   generator_state.data_ptr(), generator_state.nbytes());
  }

  void load_state(const CheckpointFile& file) override {
    for (size_t layer = 0; layer < state_.size(); ++layer) {
      for (size_t part = 0; part < 2; ++part) {
        const std::string name = state_record(layer, part);
        auto& t = state_[layer][part];
        const auto& record = file.get(name);
        if (record.dtype != "float32" || record.shape != t.sizes().vec() ||
            record.data.size() != t.nbytes()) {
          throw DataError("checkpoint " + file.path() + ": record '" + name +
                          "' does not fit the LSTM state of this run");
        }
        t = torch::empty(t.sizes(), torch::kFloat32);
        std::memcpy(t.data_ptr(), record.data.data(), t.nbytes());
      }
    }
    const auto& record = file.get("task/dropout_generator");
    const auto bytes = static_cast<int64_t>(record.data.size());
    if (record.dtype != "uint8" || record.shape != std::vector<int64_t>{bytes}) {
      throw DataError("checkpoint " + file.path() +
                      ": record 'task/dropout_generator' is not a generator state");
    }
    auto state = torch::empty({bytes}, torch::kUInt8);
    std::memcpy(state.data_ptr(), record.data.data(), record.data.size());
    try {
      std::lock_guard<std::mutex> lock(generator_.mutex());
      generator_.set_state(state);
    } catch (const c10::Error&) {
      throw DataError("checkpoint " + file.path() +
                      ": record 'task/dropout_generator' is not a generator state");
    }
  }

  std::vector<Metric> evaluate(comm::Communicator& comm, comm::Timeout timeout) override {
    std::vector<float> sums;
    for (const auto& data : eval_) {
      double nll = 0.0;
      evaluate_columns(
          *model_, data, task_.options().bptt, generator_,
          [&](const torch::Tensor& logits, const torch::Tensor& target) {
            nll += torch::nn::functional::cross_entropy(
                       logits, target,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                       .item<double>();
          });
      sums.push_back(static_cast<float>(nll));
      sums.push_back(static_cast<float>((data.size(0) - 1) * data.size(1)));
    }
    model_->train();
    comm.allreduce_sum(sums, timeout);
    const double validation = std::exp(sums[0] / sums[1]);
    const double test = std::exp(sums[2] / sums[3]);
    return {{"validation_perplexity", validation,
             format_number("validation perplexity %.2f", validation)},
            {"test_perplexity", test, format_number("test perplexity %.2f", test)}};
  }

 private:
  static std::string state_record(size_t layer, size_t part) {
    return detail::concat("task/lstm_state/layer", layer + 1, part == 0 ? "/h" : "/c");
  }

  const LmTask& task_;
  TrainOptions options_;
  int rank_;
  int world_;
  mutable at::Generator generator_;    // mutable: reading its state takes its mutex
  torch::Tensor train_;                // [rows, batch_size]
  std::array<torch::Tensor, 2> eval_;  // validation, test: [rows, batch_size]
  int64_t iterations_ = 0;
  std::shared_ptr<LstmLanguageModel> model_;
  LstmLanguageModel::State state_;
};

}  // namespace

LmTask::LmTask(const std::vector<std::string>& verses, const LmOptions& options)
    : options_(options) {
  DGC_CHECK_GE(options_.vocabulary, 3, "vocabulary size (<unk>, <eos> and at least one word)");
  DGC_CHECK_GE(options_.embedding, 1, "embedding size");
  DGC_CHECK_GE(options_.hidden, 1, "hidden size");
  DGC_CHECK_GE(options_.bptt, 1, "bptt");
  DGC_CHECK(options_.dropout >= 0.0 && options_.dropout < 1.0, "dropout must be in [0, 1), got ",
            options_.dropout);
  vocabulary_ = kjv::build_vocabulary(verses, options_.vocabulary);
  for (const auto part : {kjv::Part::kTrain, kjv::Part::kValidation, kjv::Part::kTest}) {
    auto& stream = streams_[static_cast<size_t>(part)];
    stream = kjv::encode(verses, vocabulary_, part);
    auto& ends = verse_ends_[static_cast<size_t>(part)];
    for (size_t i = 0; i < stream.size(); ++i) {
      if (stream[i] == kjv::kEos) ends.push_back(static_cast<int64_t>(i + 1));
    }
  }
}

std::vector<int32_t> LmTask::stream(kjv::Part part, int64_t limit, int64_t* verses) const {
  const auto& all = streams_[static_cast<size_t>(part)];
  const auto& ends = verse_ends_[static_cast<size_t>(part)];
  const int64_t count = used_count(static_cast<int64_t>(ends.size()), limit);
  if (verses != nullptr) *verses = count;
  const int64_t end = count > 0 ? ends[static_cast<size_t>(count - 1)] : 0;
  return {all.begin(), all.begin() + end};
}

std::string LmTask::settings(const TrainOptions& options) const {
  int64_t train = 0;
  int64_t validation = 0;
  stream(kjv::Part::kTrain, options.train_examples, &train);
  stream(kjv::Part::kValidation, options.test_examples, &validation);
  std::ostringstream out;
  out << "task=lm\n"
      << "train_examples=" << train << "\n"
      << "test_examples=" << validation << "\n"
      << "vocabulary=" << options_.vocabulary << "\n"
      << "embedding=" << options_.embedding << "\n"
      << "hidden=" << options_.hidden << "\n"
      << "bptt=" << options_.bptt << "\n"
      << "dropout=" << options_.dropout << "\n";
  return out.str();
}

std::unique_ptr<TaskWorker> LmTask::make_worker(const TrainOptions& options, int rank,
                                                int world_size) const {
  return std::make_unique<LmWorker>(*this, options, rank, world_size);
}

TaskDefaults lm_task_defaults() {
  const TaskDefaults shared = shared_task_defaults();
  return {.model = "lstm",
          .epochs = shared.epochs,
          .batch_size = 10,
          .lr = 5.0,
          .weight_decay = 0.0,
          .clip_norm = 0.25,
          .masking = false,
          .selection_scope = SelectionScope::kGlobal};
}

std::unique_ptr<LmTask> load_lm_task(const LmOptions& options) {
  const std::string dir = options.cache_dir.empty() ? kjv::default_cache_dir() : options.cache_dir;
  return std::make_unique<LmTask>(kjv::load_verses(dir, options.bible), options);
}

TokenLosses token_losses(const LmTask& task, LstmLanguageModel& model, kjv::Part part,
                         int64_t limit, int world, int64_t batch_size) {
  DGC_CHECK_GE(world, 1, "world size");
  DGC_CHECK_GE(batch_size, 1, "batch size");
  const auto stream = task.stream(part, limit);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);  // unused: no dropout in eval
  TokenLosses out;
  for (int rank = 0; rank < world; ++rank) {
    evaluate_columns(
        model, rank_columns(stream, rank, world, batch_size), task.options().bptt, generator,
        [&](const torch::Tensor& logits, const torch::Tensor& target) {
          const auto nll =
              torch::nn::functional::cross_entropy(
                  logits, target,
                  torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                  .to(torch::kFloat64)
                  .contiguous();
          const auto ids = target.contiguous();
          const double* n = nll.data_ptr<double>();
          const int64_t* t = ids.data_ptr<int64_t>();
          for (int64_t i = 0; i < ids.numel(); ++i) {
            out.targets.push_back(static_cast<int32_t>(t[i]));
            out.nll.push_back(n[i]);
          }
        });
  }
  return out;
}

std::vector<WordBand> frequency_bands(int64_t size) {
  DGC_CHECK_GE(size, 3, "vocabulary size");
  std::vector<WordBand> bands = {{"<eos>", kjv::kEos, kjv::kEos}};
  const int64_t words = size - 2;  // ids 2 .. size - 1 are the words of rank 1 .. words
  for (int64_t first = 1, last = 10; first <= words; first = last + 1, last *= 10) {
    const int64_t end = std::min(last, words);
    bands.push_back({detail::concat("words ", first, "-", end), static_cast<int32_t>(first + 1),
                     static_cast<int32_t>(end + 1)});
  }
  bands.push_back({"<unk>", kjv::kUnk, kjv::kUnk});
  return bands;
}

void load_model_parameters(const CheckpointFile& file, torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string name = "model/param/" + item.key();
    if (!file.has(name)) {
      throw DataError("checkpoint " + file.path() + " has no parameter '" + item.key() +
                      "': it is not a checkpoint of this model");
    }
    const auto& record = file.get(name);
    auto& tensor = item.value();
    if (record.dtype != "float32" || record.shape != tensor.sizes().vec()) {
      throw DataError(detail::concat("checkpoint ", file.path(), ": parameter '", item.key(),
                                     "' has shape ", shape_text(record.shape), ", this model's is ",
                                     shape_text(tensor.sizes().vec()),
                                     " (another vocabulary, embedding or hidden size)"));
    }
    file.get_floats(name, std::span(tensor.data_ptr<float>(), static_cast<size_t>(tensor.numel())));
  }
}

}  // namespace dgc::train
