// Checkpoint cost: save_checkpoint and load_checkpoint of a model of N parameters with
// AdamW (weights + 2 moments), against torch::save / torch::load of the same tensors,
// alternating in one process; prints sizes, median times and ratios. Not a test.
// The baseline gets the same durability: each save is a new file, flushed to disk
// (fsync) and renamed over the previous one, as save_checkpoint does.
//
//   checkpoint_bench [--params N] [--reps R] [--dir D]
#include <stepwise/stepwise.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "support/remove_tree.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct FlatImpl : torch::nn::Module {
  explicit FlatImpl(int64_t n) : w(register_parameter("w", torch::randn({n}))) {}
  torch::Tensor w;
};
TORCH_MODULE(Flat);

template <typename F>
double seconds(F&& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uintmax_t size_of(const fs::path& path) {
  uintmax_t total = 0;
  if (fs::is_regular_file(path)) return fs::file_size(path);
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 10'000'000, reps = 8;
  std::string dir = (fs::temp_directory_path() / "stepwise-checkpoint-bench").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--params") params = std::stoll(argv[i + 1]);
    if (arg == "--reps") reps = std::stoll(argv[i + 1]);
    if (arg == "--dir") dir = argv[i + 1];
  }
  stepwise::testing::remove_tree(dir);
  fs::create_directories(dir);
  torch::manual_seed(0);
  Flat model(params);
  auto engine = stepwise::initialize(model, stepwise::Config::from_string(R"({
      "train_batch_size": 1, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})"));
  engine.backward(model->w.square().mean());
  engine.step();
  // The tensors torch::save gets: the engine's weights and AdamW's two moments as they are
  // at that moment, so that after a load both saves write the tensors the load made. Memory
  // that read() has just filled costs its first access from user code on the CI machine (a
  // VM: 0.11 s for 80 MB the first time, 0.6 ms the second, measured with a plain C++
  // program), so a baseline holding tensors from before the loads measured the save at
  // 1.4-1.7x while writing the same bytes: the optimizer file took 0.19-0.21 s right after a
  // load and 0.08-0.10 s after the tensors had been read once.
  const auto engine_tensors = [&] {
    std::vector<torch::Tensor> tensors = {model->w.detach()};
    for (const auto& [key, state] : engine.optimizer().state()) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
      tensors.push_back(s.exp_avg());
      tensors.push_back(s.exp_avg_sq());
    }
    return tensors;
  };
  const std::string plain = dir + "/plain.pt";
  std::vector<double> save_sw, save_plain, load_sw, load_plain;
  // What runs first pays for what ran before it (page cache, freed memory): measured here,
  // torch::save took 0.356 s when it ran right after the loads and 0.194 s right after
  // save_checkpoint. So the order alternates (with an even --reps, each median has as many
  // firsts as seconds).
  const auto save_one = [&] {
    save_sw.push_back(
        seconds([&] { engine.save_checkpoint(dir, stepwise::SaveOptions().tag("b")); }));
  };
  const auto save_other = [&] {
    const auto tensors = engine_tensors();
    save_plain.push_back(seconds([&] {
      torch::save(tensors, plain + ".new");
      const int fd = ::open((plain + ".new").c_str(), O_RDONLY);
      ::fsync(fd);
      ::close(fd);
      fs::rename(plain + ".new", plain);
    }));
  };
  const auto load_one = [&] {
    load_sw.push_back(
        seconds([&] { engine.load_checkpoint(dir, stepwise::LoadOptions().tag("b")); }));
  };
  const auto load_other = [&] {
    load_plain.push_back(seconds([&] {
      std::vector<torch::Tensor> back;
      torch::load(back, plain);
    }));
  };
  for (int64_t r = 0; r < reps; ++r) {
    if (r % 2 == 0) {  // save_checkpoint first
      save_one();
      save_other();
      load_one();
      load_other();
    } else {
      save_other();
      save_one();
      load_other();
      load_one();
    }
  }
  const double size_sw = static_cast<double>(size_of(fs::path(dir) / "b"));
  const double size_plain = static_cast<double>(size_of(plain));
  std::printf(
      "checkpoint: %lld parameters, AdamW; save_checkpoint/load_checkpoint against torch::save/"
      "torch::load of the same tensors (weights, exp_avg, exp_avg_sq); %lld reps in alternating "
      "order, median\n",
      (long long)params, (long long)reps);
  std::printf("size: %.1f MB against %.1f MB: %.3fx\n", size_sw / 1e6, size_plain / 1e6,
              size_sw / size_plain);
  std::printf("save: %.3f s against %.3f s: %.3fx (both written new, fsynced and renamed)\n",
              median(save_sw), median(save_plain), median(save_sw) / median(save_plain));
  std::printf("load: %.3f s against %.3f s: %.3fx\n", median(load_sw), median(load_plain),
              median(load_sw) / median(load_plain));
  stepwise::testing::remove_tree(dir);
}
