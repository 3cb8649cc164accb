// A process that saves checkpoints until it is killed (tests/checkpoint/kill_test.cpp):
//
//   stepwise_checkpoint_saver DIR ELEMENTS
//
// Builds an engine over one parameter of ELEMENTS floats, saves the complete
// checkpoint "first", prints "ready", then saves "t0", "t1", ... printing "saving" before
// each, until a signal ends it.
#include <stepwise/stepwise.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

struct BigImpl : torch::nn::Module {
  explicit BigImpl(int64_t n) : w(register_parameter("w", torch::full({n}, 0.5))) {}
  torch::Tensor w;
};
TORCH_MODULE(Big);

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DIR ELEMENTS\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  Big model(std::stoll(argv[2]));
  auto engine = stepwise::initialize(model, stepwise::Config::from_string(R"({
      "train_batch_size": 1, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  engine.backward(model->w.square().mean());
  engine.step();
  engine.save_checkpoint(dir, stepwise::SaveOptions().tag("first"));
  std::printf("ready\n");
  std::fflush(stdout);
  for (int64_t i = 0;; ++i) {
    std::printf("saving\n");
    std::fflush(stdout);
    engine.save_checkpoint(dir, stepwise::SaveOptions().tag("t" + std::to_string(i)));
  }
}
