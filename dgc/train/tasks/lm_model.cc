// The language model of the lm task (lm.h): a two-layer LSTM written out step by step, with
// dropout masks drawn from a generator the caller passes (no global state).
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include <torch/torch.h>

#include "dgc/train/tasks/lm.h"

namespace dgc::train {

LstmLayer::LstmLayer(int64_t input_size, int64_t hidden_size) {
  DGC_CHECK_GE(input_size, 1, "LSTM input size");
  DGC_CHECK_GE(hidden_size, 1, "LSTM hidden size");
  weight_ih = register_parameter("weight_ih", torch::empty({4 * hidden_size, input_size}));
  weight_hh = register_parameter("weight_hh", torch::empty({4 * hidden_size, hidden_size}));
  bias = register_parameter("bias", torch::empty({4 * hidden_size}));
}

torch::Tensor LstmLayer::forward(const torch::Tensor& input, std::array<torch::Tensor, 2>& state) {
  const int64_t steps = input.size(0);
  const int64_t batch = input.size(1);
  // The input projection of all steps at once; only the recurrent part is sequential.
  const auto projected =
      torch::addmm(bias, input.reshape({steps * batch, input.size(2)}), weight_ih.t())
          .view({steps, batch, -1});
  auto h = state[0];
  auto c = state[1];
  const auto weight_hh_t = weight_hh.t();
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<size_t>(steps));
  for (int64_t t = 0; t < steps; ++t) {
    const auto gates = torch::addmm(projected[t], h, weight_hh_t).chunk(4, 1);
    const auto i = torch::sigmoid(gates[0]);
    const auto f = torch::sigmoid(gates[1]);
    const auto g = torch::tanh(gates[2]);
    const auto o = torch::sigmoid(gates[3]);
    c = f * c + i * g;
    h = o * torch::tanh(c);
    outputs.push_back(h);
  }
  state = {h, c};
  return torch::stack(outputs);
}

LstmLanguageModel::LstmLanguageModel(int64_t vocabulary, int64_t embedding, int64_t hidden,
                                     double dropout, uint64_t seed)
    : vocabulary_(vocabulary), hidden_(hidden), dropout_(dropout) {
  DGC_CHECK_GE(vocabulary, 3, "vocabulary size");
  DGC_CHECK_GE(embedding, 1, "embedding size");
  DGC_CHECK(dropout >= 0.0 && dropout < 1.0, "dropout must be in [0, 1), got ", dropout);
  embedding_ = register_parameter("embedding", torch::empty({vocabulary, embedding}));
  layer1_ = register_module("lstm1", std::make_shared<LstmLayer>(embedding, hidden));
  layer2_ = register_module("lstm2", std::make_shared<LstmLayer>(hidden, hidden));
  decoder_ = register_parameter("decoder", torch::empty({vocabulary, hidden}));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  embedding_.uniform_(-0.1, 0.1, generator);
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (auto* layer : {layer1_.get(), layer2_.get()}) {
    layer->weight_ih.uniform_(-bound, bound, generator);
    layer->weight_hh.uniform_(-bound, bound, generator);
    layer->bias.uniform_(-bound, bound, generator);
  }
  decoder_.uniform_(-0.1, 0.1, generator);
}

torch::Tensor LstmLanguageModel::dropout(const torch::Tensor& x, at::Generator& generator) {
  if (!is_training() || dropout_ == 0.0) return x;
  const double keep = 1.0 - dropout_;
  return x * torch::empty_like(x).bernoulli_(keep, generator).div_(keep);
}

torch::Tensor LstmLanguageModel::forward(const torch::Tensor& tokens, State& state,
                                         at::Generator& generator) {
  auto x = dropout(torch::embedding(embedding_, tokens), generator);
  x = dropout(layer1_->forward(x, state[0]), generator);
  x = dropout(layer2_->forward(x, state[1]), generator);
  return torch::mm(x.reshape({-1, hidden_}), decoder_.t());
}

LstmLanguageModel::State LstmLanguageModel::initial_state(int64_t batch) const {
  State state;
  for (auto& layer : state) {
    for (auto& t : layer) t = torch::zeros({batch, hidden_});
  }
  return state;
}

}  // namespace dgc::train
