// The model of examples/char_lm.cpp, shared with tools/bench/char_lm_bench.cpp: a small
// character-level transformer (2 blocks of causal self-attention and a GELU MLP,
// LayerNorm, dropout 0.1), and the random micro-batches it trains on.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace char_lm {

inline constexpr int64_t kBlock = 32;  // context length
inline constexpr int64_t kEmbed = 64;
inline constexpr int64_t kHeads = 4;
inline constexpr int64_t kLayers = 2;
inline constexpr double kDropout = 0.1;
inline constexpr int64_t kMicroBatch = 16;  // sequences per micro-batch and rank

struct BlockImpl : torch::nn::Module {
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, up{nullptr}, down{nullptr};
  torch::nn::Dropout drop{nullptr};
  BlockImpl() {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kEmbed})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kEmbed})));
    qkv = register_module("qkv", torch::nn::Linear(kEmbed, 3 * kEmbed));
    proj = register_module("proj", torch::nn::Linear(kEmbed, kEmbed));
    up = register_module("up", torch::nn::Linear(kEmbed, 4 * kEmbed));
    down = register_module("down", torch::nn::Linear(4 * kEmbed, kEmbed));
    drop = register_module("drop", torch::nn::Dropout(kDropout));
  }
  torch::Tensor attention(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = kEmbed / kHeads;
    auto parts = qkv(x).split(kEmbed, -1);
    auto heads = [&](const torch::Tensor& p) { return p.view({b, t, kHeads, hd}).transpose(1, 2); };
    auto scores = torch::matmul(heads(parts[0]), heads(parts[1]).transpose(-2, -1)) /
                  std::sqrt(static_cast<double>(hd));
    auto causal = torch::ones({t, t}, torch::kBool).triu(1).to(x.device());
    auto weights = drop(torch::softmax(scores.masked_fill(causal, -1e9), -1));
    auto out = torch::matmul(weights, heads(parts[2])).transpose(1, 2).reshape({b, t, kEmbed});
    return drop(proj(out));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attention(ln1(x));
    return x + drop(down(torch::gelu(up(ln2(x)))));
  }
};
TORCH_MODULE(Block);

struct CharLMImpl : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr}, positions{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  explicit CharLMImpl(int64_t vocab) {
    tokens = register_module("tokens", torch::nn::Embedding(vocab, kEmbed));
    positions = register_module("positions", torch::nn::Embedding(kBlock, kEmbed));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < kLayers; ++i) blocks->push_back(Block());
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kEmbed})));
    head = register_module("head", torch::nn::Linear(kEmbed, vocab));
  }
  torch::Tensor forward(const torch::Tensor& idx) {  // [B, T] -> logits [B, T, vocab]
    auto pos = torch::arange(idx.size(1), idx.options());
    auto x = tokens(idx) + positions(pos);
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    return head(ln_f(x));
  }
};
TORCH_MODULE(CharLM);

// A text as token ids (the bytes it uses, numbered in order of appearance).
struct Corpus {
  explicit Corpus(const std::string& text) {
    std::vector<int64_t> index_of(256, -1);
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if (index_of[c] < 0) index_of[c] = vocab++;
      ids[i] = index_of[c];
    }
    data = torch::tensor(ids, torch::kLong);
  }
  // Random windows of the text from the default generator: (inputs, next characters).
  std::pair<torch::Tensor, torch::Tensor> micro_batch(int64_t rows_per_batch = kMicroBatch) const {
    auto starts = torch::randint(data.size(0) - kBlock - 1, {rows_per_batch}, torch::kLong);
    auto offsets = torch::arange(kBlock + 1, torch::kLong);
    auto rows = data.index({starts.unsqueeze(1) + offsets});
    return {rows.narrow(1, 0, kBlock), rows.narrow(1, 1, kBlock)};
  }
  int64_t vocab = 0;
  torch::Tensor data;
};

}  // namespace char_lm
