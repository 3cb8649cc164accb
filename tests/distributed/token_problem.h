// The token-level recipe's problem (docs/accumulation-in-depth.md), shared by the worker's
// token-recipe, which trains it on two ranks, and the test, which trains it as one batch.
#pragma once

#include <stepwise/stepwise.h>

#include <nlohmann/json.hpp>

#include <cstdint>

namespace stepwise::testing {

/// Linear(4, 1) from seed 0 in an engine with SGD (lr 0.1), and the window's 20 tokens
/// (seed 1, drawn after initialize has joined the group), each a row of 4 features.
struct TokenProblem {
  torch::nn::Linear model;
  Engine engine;
  torch::Tensor tokens;
};

inline TokenProblem token_problem(int64_t micro_batch, int64_t gas) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  auto engine = initialize(
      model, Config::from_json({{"train_micro_batch_size_per_gpu", micro_batch},
                                {"gradient_accumulation_steps", gas},
                                {"steps_per_print", 1000000000},
                                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}}));
  torch::manual_seed(1);
  auto tokens = torch::randn({20, 4});
  return {model, std::move(engine), tokens};
}

}  // namespace stepwise::testing
