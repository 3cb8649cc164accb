// The full stepwise training loop on a synthetic regression problem.
//
//   train_regression [ds_config.json] [--epochs N]
//
// Prints the loss and lr of every optimizer step and a progress line.
#include <stepwise/stepwise.h>

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace {

struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::tanh(fc1->forward(x)));
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = "ds_config.json";
  int64_t epochs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::stoll(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      std::cerr << "unknown option " << arg << "; usage: train_regression [ds_config.json] "
                << "[--epochs N]\n";
      return 2;
    } else {
      config_path = arg;
    }
  }
  torch::manual_seed(0);
  // Synthetic data: y = sum(sin(x)) + noise, 1000 samples.
  const int64_t n = 1000;
  auto x = torch::randn({n, 8});
  auto y = torch::sin(x).sum(1, true) + 0.05 * torch::randn({n, 1});

  auto model = std::make_shared<Mlp>();
  try {
    auto engine = stepwise::initialize(model, stepwise::Config::from_file(config_path));
    const int64_t mbs = engine.train_micro_batch_size_per_gpu();
    const int64_t micro_batches = n / mbs;
    // This loop flushes at every epoch end, so each epoch has ceil(micro_batches / GAS) steps.
    const int64_t total_steps = stepwise::total_num_steps(
        micro_batches, epochs, engine.gradient_accumulation_steps(), stepwise::EpochEnd::kFlush);
    std::printf("config %s: micro batch %lld, GAS %lld, train batch %lld, %lld epochs\n",
                config_path.c_str(), static_cast<long long>(mbs),
                static_cast<long long>(engine.gradient_accumulation_steps()),
                static_cast<long long>(engine.train_batch_size()), static_cast<long long>(epochs));
    double first_loss = -1.0, window_loss = 0.0, last_loss = 0.0;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      auto order = torch::randperm(n);
      for (int64_t b = 0; b < micro_batches; ++b) {
        auto idx = order.slice(0, b * mbs, (b + 1) * mbs);
        auto loss = torch::mse_loss(model->forward(x.index_select(0, idx)), y.index_select(0, idx));
        // backward() returns loss / GAS: summed over a window it is the window's mean loss.
        window_loss += engine.backward(loss).item<double>();
        const bool boundary = engine.is_gradient_accumulation_boundary();
        engine.step();  // after EVERY micro-batch
        if (boundary) {
          if (first_loss < 0) first_loss = window_loss;
          last_loss = window_loss;
          std::printf("step %4lld  loss %.6f  lr %.6f  grad_norm %.4f\n",
                      static_cast<long long>(engine.global_steps()), window_loss,
                      engine.get_lr()[0], engine.global_grad_norm());
          window_loss = 0.0;
        }
      }
      if (engine.flush()) {  // the epoch's remainder: a partial window, stepped as its mean
        std::printf("step %4lld  (end of epoch %lld: flushed a partial window)\n",
                    static_cast<long long>(engine.global_steps()),
                    static_cast<long long>(epoch + 1));
        window_loss = 0.0;
      }
      std::fprintf(stderr, "[progress] epoch %lld/%lld  optimizer steps %lld/%lld  samples %lld\n",
                   static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                   static_cast<long long>(engine.global_steps()),
                   static_cast<long long>(total_steps),
                   static_cast<long long>(engine.global_samples()));
    }
    if (engine.global_steps() != total_steps) {  // what total_num_steps promised the scheduler
      std::fprintf(stderr, "ran %lld optimizer steps where total_num_steps said %lld\n",
                   static_cast<long long>(engine.global_steps()),
                   static_cast<long long>(total_steps));
      return 1;
    }
    std::printf("final loss %.6f (started at %.6f): %s\n", last_loss, first_loss,
                last_loss < first_loss ? "improved" : "DID NOT IMPROVE");
    return last_loss < first_loss ? 0 : 1;
  } catch (const stepwise::ConfigError& e) {
    std::cerr << "configuration error: " << e.what() << "\n";
    return 2;
  }
}
