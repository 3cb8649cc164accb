// Context "loader": what the README's loop (and engine.h's usage) needs.
//
// Members a fragment can use:
//   model    torch::nn::Linear(4, 1), seeded
//   loader   8 micro-batches of {data [2, 4], target [2, 1]}
// and the working directory is a scratch folder holding ds_config.json (mbs 2, GAS 4,
// AdamW lr 0.01, clip 1.0); the previous one is restored afterwards.
#pragma once

#include <stepwise/stepwise.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <ftw.h>     // nftw
#include <stdio.h>   // remove
#include <stdlib.h>  // mkdtemp

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

struct Batch {
  torch::Tensor data;
  torch::Tensor target;
};

struct loader_context {
  loader_context() {
    std::string dir = (std::filesystem::temp_directory_path() / "stepwise-XXXXXX").string();
    scratch_ = mkdtemp(dir.data()) != nullptr ? dir : throw std::runtime_error("mkdtemp failed");
    std::filesystem::current_path(scratch_);
    std::ofstream("ds_config.json") << R"({
      "train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}
    })";
  }
  ~loader_context() {
    std::filesystem::current_path(previous_);
    // Not std::filesystem::remove_all: it crashes inside PyTorch 2.11's libtorch.so
    // (docs/cuda.md, "PyTorch's pip wheels").
    ::nftw(
        scratch_.c_str(),
        [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  loader_context(const loader_context&) = delete;
  loader_context& operator=(const loader_context&) = delete;

  static torch::nn::Linear make_model() {
    torch::manual_seed(0);
    return torch::nn::Linear(4, 1);
  }

  static std::vector<Batch> make_loader() {
    torch::manual_seed(1);
    std::vector<Batch> out;
    for (int i = 0; i < 8; ++i) {
      out.push_back({torch::randn({2, 4}), torch::randn({2, 1})});
    }
    return out;
  }

  std::filesystem::path previous_ = std::filesystem::current_path();
  std::filesystem::path scratch_;
  torch::nn::Linear model = make_model();
  std::vector<Batch> loader = make_loader();
};
