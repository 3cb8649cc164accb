// Context "engine": a tiny linear model, fixed data and an engine with GAS = 4.
//
// Members a fragment can use:
//   model    torch::nn::Linear(4, 1), seeded
//   engine   stepwise::Engine from `config_json` (mbs 2, GAS 4, AdamW lr 0.01, clip 1.0)
//   batches  8 micro-batches {x [2, 4], y [2, 1]}
//   loss_of(i)  the MSE loss of micro-batch i under the current model
//
// The model and batches live on $STEPWISE_DOCS_DEVICE (default CPU; tools/gpu-check
// sets "cuda"), so the same fragments test the CUDA path on a GPU machine.
// Its includes are basic.h's, line for line (NOTE: [leading-includes PCH] in
// snippets/copies_test.py).
#pragma once

#include <stepwise/stepwise.h>
#include <torch/autograd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

struct engine_context {
  static constexpr const char* config_json = R"({
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}
  })";

  static torch::Device device() {
    const char* name = std::getenv("STEPWISE_DOCS_DEVICE");
    return torch::Device(name != nullptr && *name != '\0' ? name : "cpu");
  }

  static torch::nn::Linear make_model() {
    torch::manual_seed(0);
    torch::nn::Linear model(4, 1);
    model->to(device());
    return model;
  }

  static std::vector<std::pair<torch::Tensor, torch::Tensor>> make_batches() {
    torch::manual_seed(1);
    std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
    for (int i = 0; i < 8; ++i) {
      auto x = torch::randn({2, 4});
      auto y = torch::randn({2, 1});
      out.emplace_back(x.to(device()), y.to(device()));
    }
    return out;
  }

  torch::Tensor loss_of(size_t i) {
    return torch::mse_loss(model->forward(batches[i].first), batches[i].second);
  }

  torch::nn::Linear model = make_model();
  stepwise::Engine engine = stepwise::initialize(model, stepwise::Config::from_string(config_json));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches = make_batches();
};
