// Throughput of examples/char_lm through the engine against a hand-written LibTorch loop
// doing the same work (issue 26, item 8), in one run: the same model, parameter groups
// (no weight decay for biases and norms), AdamW, WarmupDecayLR, clipping at 1.0 and GAS 2
// on the same batches; the engine with its monitor on (a progress line every 10 steps and
// the CSV files). Each is timed twice, alternating, after a warm-up; the faster of each
// pair counts. Prints tokens/s for both and the ratio of their times.
//
//   char_lm_bench [--steps N] [--text FILE]
#include <stepwise/stepwise.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "char_lm_model.h"

namespace {

using namespace char_lm;
using Clock = std::chrono::steady_clock;

constexpr int64_t kGas = 2;
constexpr int64_t kWarmup = 5;  // optimizer steps before the clock starts

stepwise::WarmupDecayLROptions schedule(int64_t total) {
  return stepwise::WarmupDecayLROptions().total_num_steps(total).warmup(
      stepwise::WarmupLROptions().warmup_max_lr(3e-3).warmup_num_steps(20).warmup_type(
          stepwise::WarmupType::kLinear));
}

torch::Tensor loss_of(CharLM& model, const Corpus& corpus, int64_t vocab) {
  auto [x, y] = corpus.micro_batch();
  auto logits = model->forward(x);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1}));
}

// The hand-written loop: what a LibTorch user writes without an engine.
std::pair<double, double> hand(const Corpus& corpus, int64_t steps) {
  torch::manual_seed(0);
  CharLM model(corpus.vocab);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& g : stepwise::weight_decay_groups(*model)) {
    groups.emplace_back(
        g.params,
        std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(3e-3).weight_decay(g.weight_decay().value_or(0.1))));
  }
  torch::optim::AdamW optimizer(std::move(groups));
  auto scheduler = stepwise::make_scheduler(schedule(kWarmup + steps), optimizer);
  torch::manual_seed(1000);
  Clock::time_point start;
  torch::Tensor loss;
  for (int64_t s = 0; s < kWarmup + steps; ++s) {
    if (s == kWarmup) start = Clock::now();
    torch::Tensor window = torch::zeros({});
    for (int64_t m = 0; m < kGas; ++m) {  // no host sync: the loss is read once, at the end
      auto l = loss_of(model, corpus, corpus.vocab) / static_cast<double>(kGas);
      l.backward();
      window += l.detach();
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
    scheduler->step();
    loss = window;
  }
  return {std::chrono::duration<double>(Clock::now() - start).count(), loss.item<double>()};
}

// The same through the engine, monitor on.
std::pair<double, double> engine(const Corpus& corpus, int64_t steps, const std::string& csv) {
  torch::manual_seed(0);
  CharLM model(corpus.vocab);
  auto config =
      stepwise::Config::from_string(c10::str(R"({"train_micro_batch_size_per_gpu": )", kMicroBatch,
                                             R"(, "gradient_accumulation_steps": )", kGas,
                                             R"(, "gradient_clipping": 1.0, "steps_per_print": 10,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
          "csv_monitor": {"enabled": true, "output_path": ")",
                                             csv, R"(", "job_name": "bench"}})"));
  config.scheduler = schedule(kWarmup + steps);
  auto e = stepwise::initialize(model, config, stepwise::weight_decay_groups(*model));
  torch::manual_seed(1000);
  Clock::time_point start;
  for (int64_t t = 0; t < (kWarmup + steps) * kGas; ++t) {
    if (t == kWarmup * kGas) start = Clock::now();
    auto l = loss_of(model, corpus, corpus.vocab);
    e.backward(l, stepwise::BackwardOptions().tokens(kMicroBatch * kBlock));
    e.step();
  }
  return {std::chrono::duration<double>(Clock::now() - start).count(),
          e.window_loss().item<double>()};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 40;
  std::string text = "/usr/share/common-licenses/GPL-3";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") {
      steps = std::stoll(argv[i + 1]);
    } else if (a == "--text") {
      text = argv[i + 1];
    }
  }
  std::ifstream in(text, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().size() < 1000) {
    std::cerr << "char_lm_bench: cannot read " << text << " (pass --text FILE)\n";
    return 2;
  }
  const Corpus corpus(s.str());
  const std::string csv = (std::filesystem::temp_directory_path() / "char_lm_bench_csv").string();
  double hand_s = 1e30, engine_s = 1e30, hand_loss = 0, engine_loss = 0;
  for (int round = 0; round < 2; ++round) {
    const auto h = hand(corpus, steps);
    const auto e = engine(corpus, steps, csv);
    hand_s = std::min(hand_s, h.first);
    engine_s = std::min(engine_s, e.first);
    hand_loss = h.second;
    engine_loss = e.second;
  }
  std::filesystem::remove_all(csv);
  const double tokens = static_cast<double>(steps * kGas * kMicroBatch * kBlock);
  std::printf("char_lm, %lld optimizer steps of %lld tokens (GAS %lld), best of 2 each:\n",
              (long long)steps, (long long)(kGas * kMicroBatch * kBlock), (long long)kGas);
  std::printf("  hand-written loop  %8.0f tokens/s  (last window loss %.4f)\n", tokens / hand_s,
              hand_loss);
  std::printf("  engine, monitor on %8.0f tokens/s  (last window loss %.4f)\n", tokens / engine_s,
              engine_loss);
  std::printf("  engine / hand time: %.3fx\n", engine_s / hand_s);
  return 0;
}
