// A few optimizer steps with an engine, built against an installed stepwise
// (examples/consumer/CMakeLists.txt). Prints one line; exits 1 if the loss did not drop.
#include <stepwise/stepwise.h>

#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstdio>

int main() {
  torch::manual_seed(0);
  const int64_t micro_batch = 8, micro_batches = 8;
  const auto x = torch::randn({micro_batch * micro_batches, 4});
  const auto y = x.sum(/*dim=*/1, /*keepdim=*/true);  // linear: a Linear layer can fit it

  torch::nn::Linear model(4, 1);
  auto engine = stepwise::initialize(model, stepwise::Config::from_string(R"({
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}}
  })"));
  auto full_loss = [&] {
    torch::NoGradGuard no_grad;
    return torch::mse_loss(model->forward(x), y).item<double>();
  };

  const double before = full_loss();
  for (int64_t b = 0; b < micro_batches; ++b) {
    const auto rows = torch::arange(b * micro_batch, (b + 1) * micro_batch);
    const auto loss =
        torch::mse_loss(model->forward(x.index_select(0, rows)), y.index_select(0, rows));
    engine.backward(loss);
    engine.step();  // after every micro-batch; the optimizer steps every 2nd
  }
  const double after = full_loss();
  std::printf("stepwise consumer: %lld optimizer steps, %lld micro-batches, loss %.4f -> %.4f\n",
              static_cast<long long>(engine.global_steps()), static_cast<long long>(micro_batches),
              before, after);
  return after < before ? 0 : 1;
}
