// The monitor: DeepSpeed's CSV files with every optimizer step's loss, lr and loss scale,
// and the progress line's fields.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "support/error_of.h"
#include "support/scratch_dir.h"

namespace stepwise {
namespace {

namespace fs = std::filesystem;

// Element-wise, so that fp16 runs on the CPU.
struct ScaleNetImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::linspace(0.2, 0.8, 4));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1); }
};
TORCH_MODULE(ScaleNet);

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string row(int64_t step, double value) {
  std::ostringstream out;
  out << std::setprecision(9) << step << "," << value;
  return out.str();
}

// 7 optimizer steps of GAS 2, printing every 3: what the files must hold, step by step.
struct Expected {
  std::vector<std::string> loss, lr, scale;
};

Expected train(const std::string& json, bool fp16) {
  ScaleNet net;
  auto engine = initialize(net, Config::from_string(json));
  Expected expected;
  for (int64_t t = 0; t < 14; ++t) {
    torch::manual_seed(t);
    const auto dtype = fp16 ? torch::kHalf : torch::kFloat;
    auto x = torch::randn({2, 4}).to(dtype);
    engine.backward((net->forward(x) - 1.0).pow(2).mean());
    engine.step();
    if (t % 2 == 1) {
      const int64_t samples = engine.global_samples();
      expected.loss.push_back(row(samples, engine.window_loss().item<double>()));
      expected.lr.push_back(row(samples, engine.get_lr()[0]));
      if (fp16) expected.scale.push_back(row(samples, engine.loss_scale()));
    }
  }
  return expected;  // the engine goes: the rows since the last print step are written
}

TEST(Monitor, CsvMonitorWritesDeepSpeedsFilesWithEveryStep) {
  for (bool fp16 : {false, true}) {
    testing::ScratchDir dir("stepwise-csv-monitor");
    const std::string json = c10::str(
        R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
            "steps_per_print": 3, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
            "csv_monitor": {"enabled": true, "output_path": ")",
        dir.path(), R"(", "job_name": "job"}, "fp16": {"enabled": )", fp16 ? "true" : "false",
        R"(, "initial_scale_power": 4}})");
    const Expected expected = train(json, fp16);
    const fs::path folder = fs::path(dir.path()) / "job";
    auto with_header = [](const std::string& name, std::vector<std::string> rows) {
      rows.insert(rows.begin(), "step," + name);
      return rows;
    };
    EXPECT_EQ(lines_of(folder / "Train_Samples_train_loss.csv"),
              with_header("train_loss", expected.loss));
    EXPECT_EQ(lines_of(folder / "Train_Samples_lr.csv"), with_header("lr", expected.lr));
    EXPECT_EQ(fs::exists(folder / "Train_Samples_loss_scale.csv"), fp16);
    if (fp16) {
      EXPECT_EQ(lines_of(folder / "Train_Samples_loss_scale.csv"),
                with_header("loss_scale", expected.scale));
    }
    // A second run (a resume) appends its rows under the same header.
    train(json, fp16);
    EXPECT_EQ(lines_of(folder / "Train_Samples_lr.csv").size(), 1 + 2 * expected.lr.size());
  }
}

TEST(Monitor, TheProgressLineShowsLossRatesTimeEtaAndMemory) {
  ScaleNet net;
  auto engine = initialize(net, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 2,
      "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 1,
                    "total_num_steps": 10}}})"));
  ::testing::internal::CaptureStderr();
  for (int64_t t = 0; t < 4; ++t) {
    torch::manual_seed(t);
    engine.backward((net->forward(torch::randn({2, 4})) - 1.0).pow(2).mean(),
                    BackwardOptions().tokens(16));
    engine.step();
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  std::ostringstream loss;
  loss << std::setprecision(6) << engine.window_loss().item<double>();
  EXPECT_NE(out.find("[stepwise] step=2 loss=" + loss.str() + " lr="), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(" skipped=0 samples=8 samples/s=[0-9.]+ tokens/s=[0-9.]+ ms/step=[0-9.]+ "
                      "eta=[0-9]+:[0-9]{2}:[0-9]{2} peak_rss=[0-9]+MiB")))
      << out;
  EXPECT_NE(
      error_of<UsageError>([&] {
        engine.backward(net->forward(torch::randn({2, 4})).mean(), BackwardOptions().tokens(-1));
      }).find("BackwardOptions().tokens(-1)"),
      std::string::npos);
}

TEST(Monitor, CsvMonitorKeysAreDeepSpeedsAndNothingElse) {
  const auto config = Config::from_string(
      R"({"train_batch_size": 2, "csv_monitor": {"enabled": true, "job_name": "x"}})");
  EXPECT_TRUE(config.csv_monitor.enabled());
  EXPECT_EQ(config.csv_monitor.output_path(), "");
  EXPECT_EQ(config.csv_monitor.job_name(), "x");
  EXPECT_NE(testing::error_of<ConfigError>([] {
              Config::from_string(R"({"train_batch_size": 2, "csv_monitor": {"path": "x"}})");
            }).find("csv_monitor.path"),
            std::string::npos);
  const auto tensorboard =
      Config::from_string(R"({"train_batch_size": 2, "tensorboard": {"enabled": true}})");
  ASSERT_EQ(tensorboard.notes.size(), 1u);
  EXPECT_NE(tensorboard.notes[0].find("\"csv_monitor\" writes the same events"), std::string::npos);
}

}  // namespace
}  // namespace stepwise
