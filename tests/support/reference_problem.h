// Test support: the deterministic problem of tests/data/deepspeed/README.md
// and a reader for its DSREF trace lines.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace stepwise::testing {

/// Linear(4, 1) with weight[0][b] = 0.25 * cos(0.5 + 0.9 * b), bias 0.05.
torch::nn::Linear reference_linear();

/// Samples first .. first + count - 1: inputs [count, 4] and targets [count, 1].
std::pair<torch::Tensor, torch::Tensor> reference_samples(int64_t first, int64_t count);

/// First sample index a rank sees at micro-step t (README: "Which samples").
int64_t reference_start(int64_t t, int64_t gas, int64_t mbs, int64_t world, int64_t rank);

/// One parsed trace: setup, micro lines (in order) and the final weights.
struct Trace {
  nlohmann::json setup;
  std::vector<nlohmann::json> micro;
  nlohmann::json final_weights;
};

/// Reads tests/data/deepspeed/<file>, keeping the lines of `rank`.
Trace read_trace(const std::string& file, int64_t rank = 0);

/// Path of a file under tests/data.
std::string data_path(const std::string& relative);

/// The device the engine tests put models and data on: $STEPWISE_TEST_DEVICE ("cpu",
/// "cuda", "cuda:1", ...), default CPU. tools/gpu-check runs the suites with "cuda".
torch::Device test_device();

}  // namespace stepwise::testing
