// A small character-level transformer (causal self-attention, LayerNorm, dropout) trained
// through stepwise on a text file Debian ships: parameter groups (no weight decay for biases
// and norms), WarmupDecayLR, clipping, bf16 optional, checkpoints with exact resume (the
// dropout and the data order come back with the RNG state), and the progress line with
// tokens/s. One process, or several under tools/launch -n 2.
//
//   char_lm [--steps N] [--gas N] [--micro-batch N] [--bf16] [--text FILE] [--save DIR]
//           [--save-every N] [--csv DIR] [--stop-at N] [--target L] [--zero STAGE]
//
// Prints "final loss L (started at S)" and exits 1 unless the loss fell below --target.
// --stop-at N ends the process after N optimizer steps of a run planned for --steps (an
// interruption; with --save, a later run with the same options resumes it).
#include <stepwise/stepwise.h>
#include <torch/torch.h>

#include "char_lm_model.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using namespace char_lm;

struct Options {
  int64_t steps = 200;  // optimizer steps
  int64_t gas = 2;
  int64_t micro_batch = kMicroBatch;  // sequences per micro-batch and rank
  bool bf16 = false;
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string save;  // checkpoint folder: resume from it, save to it
  int64_t save_every = 50;
  std::string csv;       // csv_monitor's output_path
  double target = 2.6;   // the loss to reach (nats per character)
  int64_t stop_at = -1;  // stop after this many optimizer steps (-1: at --steps)
  int64_t zero = 0;      // ZeRO stage (docs/zero.md)
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("char_lm: cannot read " + path + " (pass --text FILE)");
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--steps")
      o.steps = std::stoll(value());
    else if (a == "--gas")
      o.gas = std::stoll(value());
    else if (a == "--micro-batch")
      o.micro_batch = std::stoll(value());
    else if (a == "--bf16")
      o.bf16 = true;
    else if (a == "--text")
      o.text = value();
    else if (a == "--save")
      o.save = value();
    else if (a == "--save-every")
      o.save_every = std::stoll(value());
    else if (a == "--csv")
      o.csv = value();
    else if (a == "--target")
      o.target = std::stod(value());
    else if (a == "--stop-at")
      o.stop_at = std::stoll(value());
    else if (a == "--zero")
      o.zero = std::stoll(value());
    else
      throw std::invalid_argument("unknown option " + a + " (see the comment atop char_lm.cpp)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const std::string text = read_text(o.text);
  const Corpus corpus(text);  // the bytes the text uses are its vocabulary
  const int64_t vocab = corpus.vocab;

  torch::manual_seed(0);  // the same initial weights on every rank (rank 0's are broadcast)
  CharLM model(vocab);
  const std::string json =
      c10::str(R"({
    "train_micro_batch_size_per_gpu": )",
               o.micro_batch, R"(, "gradient_accumulation_steps": )", o.gas, R"(,
    "gradient_clipping": 1.0, "steps_per_print": 25,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 3e-3,
                  "warmup_num_steps": 20, "total_num_steps": )",
               o.steps, R"(, "warmup_type": "linear"}},
    "bf16": {"enabled": )",
               o.bf16 ? "true" : "false", R"(}, "zero_optimization": {"stage": )", o.zero, R"(},
    "csv_monitor": {"enabled": )",
               o.csv.empty() ? "false" : "true", R"(, "output_path": ")", o.csv,
               R"(", "job_name": "char_lm"}})");
  auto engine = stepwise::initialize(model, stepwise::Config::from_string(json),
                                     stepwise::weight_decay_groups(*model));
  const int64_t rank = stepwise::distributed::rank();
  torch::manual_seed(1000 + rank);  // each rank its own batches; saved in checkpoints
  if (!o.save.empty() && std::filesystem::exists(std::filesystem::path(o.save) / "latest")) {
    engine.load_checkpoint(o.save);  // weights, optimizer, schedule, RNG: exact resume
    if (rank == 0) std::printf("resumed at step %lld\n", (long long)engine.global_steps());
  }
  double first = -1.0, last = 0.0;
  const int64_t until = o.stop_at >= 0 ? std::min(o.stop_at, o.steps) : o.steps;
  while (engine.global_steps() < until) {
    auto [x, y] = corpus.micro_batch(o.micro_batch);  // from the default generator
    auto logits = model->forward(x);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}).to(torch::kFloat),
                                                     y.reshape({-1}));
    engine.backward(loss, stepwise::BackwardOptions().tokens(x.numel()));
    engine.step();
    if (engine.micro_steps() % o.gas == 0) {  // a window ended: an optimizer step
      last = engine.window_loss().item<double>();
      if (first < 0) first = last;
      if (!o.save.empty() && engine.global_steps() % o.save_every == 0) {
        engine.save_checkpoint(o.save);
      }
    }
  }
  if (rank == 0) {
    std::printf("final loss %.9g (started at %.4f) after %lld steps: %s\n", last, first,
                (long long)engine.global_steps(),
                last < o.target ? "below the target" : "ABOVE the target");
  }
  return last < o.target ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "char_lm: " << e.what() << "\n";
  return 2;
}
