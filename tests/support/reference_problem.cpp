#include "support/reference_problem.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace stepwise::testing {

torch::nn::Linear reference_linear() {
  torch::nn::Linear model(4, 1);
  torch::NoGradGuard no_grad;
  for (int64_t b = 0; b < 4; ++b) {
    model->weight[0][b] = 0.25 * std::cos(0.5 + 0.9 * static_cast<double>(b));
  }
  model->bias.fill_(0.05);
  return model;
}

std::pair<torch::Tensor, torch::Tensor> reference_samples(int64_t first, int64_t count) {
  auto x = torch::empty({count, 4});
  auto y = torch::empty({count, 1});
  for (int64_t n = 0; n < count; ++n) {
    const double i = static_cast<double>(first + n);
    // Computed in float32, as the recording did with torch float tensors.
    float xs[4];
    for (int j = 0; j < 4; ++j) {
      xs[j] = static_cast<float>(2.0 * std::sin(0.37 * i + 1.3 * j));
      x[n][j] = xs[j];
    }
    y[n][0] = static_cast<float>(3.0 * xs[0] - 2.0 * xs[1] + xs[2] + 0.5 * std::cos(i) + 4.0);
  }
  return {x, y};
}

int64_t reference_start(int64_t t, int64_t gas, int64_t mbs, int64_t world, int64_t rank) {
  const int64_t s = t / gas;
  const int64_t m = t % gas;
  return s * (mbs * gas * world) + (m * world + rank) * mbs;
}

std::string data_path(const std::string& relative) {
  return std::string(STEPWISE_TEST_DATA) + "/" + relative;
}

Trace read_trace(const std::string& file, int64_t rank) {
  std::ifstream in(data_path("deepspeed/" + file));
  if (!in) throw std::runtime_error("cannot open trace " + file);
  Trace trace;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("DSREF ", 0) != 0) continue;
    const auto space = line.find(' ', 6);
    const std::string kind = line.substr(6, space - 6);
    auto json = nlohmann::json::parse(line.substr(space + 1));
    if (json.value("rank", int64_t{0}) != rank) continue;
    if (kind == "setup") trace.setup = json;
    if (kind == "micro") trace.micro.push_back(json);
    if (kind == "final") trace.final_weights = json["weights"];
  }
  return trace;
}

torch::Device test_device() {
  const char* name = std::getenv("STEPWISE_TEST_DEVICE");
  return torch::Device(name != nullptr && *name != '\0' ? name : "cpu");
}

}  // namespace stepwise::testing
