// Checkpoints: exact resume from every micro-step of a window, in every precision, with
// and without a scheduler, GAS 1 and 4; the errors; what a load may and may not change.
#include <stepwise/engine.h>
#include <stepwise/fused_adamw.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "support/error_of.h"
#include "support/scratch_dir.h"

namespace stepwise {
namespace {

namespace fs = std::filesystem;

// Element-wise (fp16 runs on the CPU only without matmuls in LibTorch 1.13).
struct ScaleModelImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::linspace(0.2, 0.8, 4));
  torch::Tensor b = register_parameter("b", torch::full({1}, 0.1));
  torch::Tensor steps = register_buffer("steps", torch::zeros({1}, torch::kLong));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1) + b; }
};
TORCH_MODULE(ScaleModel);

struct RunSetup {
  std::string precision;  // "fp32", "fp16", "bf16"
  bool scheduler;
  int64_t gas;
  std::string optimizer = "AdamW";
  std::string optimizer_params = "";  // more "optimizer.params" keys, with a leading comma
  std::string fp16 = R"("initial_scale_power": 12, "loss_scale_window": 2)";
};

std::string config_json(const RunSetup& s) {
  std::string json =
      c10::str(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )", s.gas,
               R"(, "gradient_clipping": 0.5, "steps_per_print": 1000000,
          "optimizer": {"type": ")",
               s.optimizer, R"(", "params": {"lr": 0.05)",
               s.optimizer == "SGD" ? R"(, "momentum": 0.9)" : "", s.optimizer_params, "}}");
  if (s.scheduler) {
    json += R"(, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.05,
        "warmup_num_steps": 3, "total_num_steps": 20, "warmup_type": "linear"}})";
  }
  if (s.precision == "fp16") {
    json += R"(, "fp16": {"enabled": true, )" + s.fp16 + "}";
  }
  if (s.precision == "bf16") json += R"(, "bf16": {"enabled": true})";
  return json + "}";
}

torch::Dtype dtype_of(const RunSetup& s) {
  return s.precision == "fp16"   ? torch::kHalf
         : s.precision == "bf16" ? torch::kBFloat16
                                 : torch::kFloat;
}

struct ResumeTrainer {
  ScaleModel model;
  Engine engine;
  RunSetup setup;
  explicit ResumeTrainer(const RunSetup& s)
      : engine(initialize(model, Config::from_string(config_json(s)))), setup(s) {}
  // Micro-step t: backward + step, with a flush after every 7th micro-batch (an epoch).
  void micro_step(int64_t t) {
    torch::manual_seed(100 + t);
    auto x = torch::randn({2, 4}).to(dtype_of(setup));
    auto y = torch::randn({2}).to(dtype_of(setup));
    engine.backward((model->forward(x) - y).pow(2).mean());
    engine.step();
    if ((t + 1) % 7 == 0) engine.flush();
  }
};

void expect_same(ResumeTrainer& a, ResumeTrainer& b, const std::string& where) {
  EXPECT_TRUE(torch::equal(a.model->w, b.model->w)) << where << a.model->w << b.model->w;
  EXPECT_TRUE(torch::equal(a.model->b, b.model->b)) << where;
  for (size_t i = 0; i < a.engine.master_params().size(); ++i) {
    EXPECT_TRUE(torch::equal(a.engine.master_params()[i], b.engine.master_params()[i]))
        << where << " master " << i;
  }
  EXPECT_EQ(a.engine.micro_steps(), b.engine.micro_steps()) << where;
  EXPECT_EQ(a.engine.global_steps(), b.engine.global_steps()) << where;
  EXPECT_EQ(a.engine.skipped_steps(), b.engine.skipped_steps()) << where;
  EXPECT_EQ(a.engine.global_samples(), b.engine.global_samples()) << where;
  EXPECT_EQ(a.engine.get_lr(), b.engine.get_lr()) << where;
  EXPECT_EQ(a.engine.loss_scale(), b.engine.loss_scale()) << where;
  EXPECT_TRUE(torch::equal(a.engine.window_loss(), b.engine.window_loss())) << where;
}

TEST(Checkpoint, ResumesBitForBitFromEveryMicroStepOfAWindow) {
  testing::ScratchDir dir("stepwise-ckpt-exact");
  const int64_t total = 18;
  for (const std::string precision : {"fp32", "fp16", "bf16"}) {
    for (bool scheduler : {false, true}) {
      for (int64_t gas : {1, 4}) {
        const RunSetup s{precision, scheduler, gas};
        ResumeTrainer whole(s);
        for (int64_t t = 0; t < total; ++t) whole.micro_step(t);
        // Every position of the second window, boundary and inside: 4..8 (GAS 4), 4..5 (GAS 1).
        for (int64_t k = 4; k <= 4 + gas; ++k) {
          const std::string where = c10::str(precision, scheduler ? " +sched" : "", " GAS ", gas,
                                             " saved after micro-step ", k, ": ");
          ResumeTrainer first(s);
          for (int64_t t = 0; t < k; ++t) first.micro_step(t);
          first.engine.save_checkpoint(dir.path());
          ResumeTrainer resumed(s);  // a fresh engine with the same construction
          resumed.engine.load_checkpoint(dir.path());
          for (int64_t t = k; t < total; ++t) resumed.micro_step(t);
          expect_same(whole, resumed, where);
        }
      }
    }
  }
}

// Dropout, and data drawn from the default generator seeded once, as a real loop draws
// them: a resume is exact only if the generator continues where the save left it.
struct DropoutModelImpl : torch::nn::Module {
  torch::nn::Linear fc = register_module("fc", torch::nn::Linear(4, 3));
  torch::nn::Dropout drop = register_module("drop", torch::nn::Dropout(0.5));
  torch::Tensor forward(const torch::Tensor& x) { return drop(fc(x)).sum(1); }
};
TORCH_MODULE(DropoutModel);

Config dropout_config(int64_t gas) {
  return Config::from_string(c10::str(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": )",
                                      gas, R"(, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})"));
}

struct DropoutRun {
  DropoutModel model;
  Engine engine;
  explicit DropoutRun(int64_t gas) : engine(initialize(model, dropout_config(gas))) {}
  void micro_step() {
    auto x = torch::randn({2, 4});
    engine.backward(model->forward(x).pow(2).mean());
    engine.step();
  }
};

TEST(Checkpoint, DropoutResumesBitForBitWithNoRngCodeInTheLoop) {
  testing::ScratchDir dir("stepwise-ckpt-rng");
  const int64_t total = 12;
  for (int64_t gas : {1, 4}) {
    torch::manual_seed(7);
    DropoutRun whole(gas);
    for (int64_t t = 0; t < total; ++t) whole.micro_step();
    for (int64_t k : {4, 5}) {  // GAS 4: a boundary and inside a window
      const std::string where = c10::str("GAS ", gas, ", saved after micro-step ", k, ": ");
      torch::manual_seed(7);
      DropoutRun first(gas);
      for (int64_t t = 0; t < k; ++t) first.micro_step();
      first.engine.save_checkpoint(dir.path());
      for (bool load_rng : {true, false}) {
        torch::manual_seed(1000 + k);  // a fresh process: another generator state
        DropoutRun resumed(gas);
        resumed.engine.load_checkpoint(dir.path(), LoadOptions().load_rng_state(load_rng));
        for (int64_t t = k; t < total; ++t) resumed.micro_step();
        // Without the generator's state the dropout masks and the data differ.
        EXPECT_EQ(torch::equal(whole.model->fc->weight, resumed.model->fc->weight), load_rng)
            << where << (load_rng ? "restored" : "not restored");
        EXPECT_EQ(torch::equal(whole.model->fc->bias, resumed.model->fc->bias), load_rng) << where;
      }
    }
  }
}

TEST(Checkpoint, SgdMomentumAndClientSchedulerResumeExactly) {
  testing::ScratchDir dir("stepwise-ckpt-sgd");
  auto build = [](ScaleModel& model) {
    auto optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 2, 0.5);
    return initialize(model, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2, "steps_per_print": 1000000})"),
                      std::move(optimizer), std::move(scheduler));
  };
  auto step = [](ScaleModel& model, Engine& engine, int64_t t) {
    torch::manual_seed(t);
    engine.backward((model->forward(torch::randn({2, 4})) - torch::randn({2})).pow(2).mean());
    engine.step();
  };
  ScaleModel m1, m2, m3;
  auto whole = build(m1);
  for (int64_t t = 0; t < 12; ++t) step(m1, whole, t);
  auto first = build(m2);
  for (int64_t t = 0; t < 5; ++t) step(m2, first, t);
  first.save_checkpoint(dir.path(), SaveOptions().tag("mid"));
  auto resumed = build(m3);
  resumed.load_checkpoint(dir.path(), LoadOptions().tag("mid"));
  for (int64_t t = 5; t < 12; ++t) step(m3, resumed, t);
  EXPECT_TRUE(torch::equal(m1->w, m3->w));
  EXPECT_EQ(whole.get_lr(), resumed.get_lr());
  EXPECT_EQ(scheduler_step_count(*whole.lr_scheduler()),
            scheduler_step_count(*resumed.lr_scheduler()));
}

TEST(Checkpoint, ClientStateAndLayout) {
  testing::ScratchDir dir("stepwise-ckpt-layout");
  ResumeTrainer r(RunSetup{"fp32", true, 4});
  for (int64_t t = 0; t < 6; ++t) r.micro_step(t);
  const std::string path = r.engine.save_checkpoint(
      dir.path(),
      SaveOptions().client_state({{"epoch", 3},
                                  {"position", 1234},
                                  {"rng", at::detail::getDefaultCPUGenerator().get_state()}}));
  EXPECT_EQ(path, (fs::path(dir.path()) / "global_step1").string());
  EXPECT_TRUE(fs::exists(fs::path(path) / "mp_rank_00_model_states.pt"));
  EXPECT_TRUE(fs::exists(fs::path(path) / "window_rank_0.pt"));
  std::ifstream latest(fs::path(dir.path()) / "latest");
  std::string tag;
  std::getline(latest, tag);
  EXPECT_EQ(tag, "global_step1");
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("other").save_latest(false));
  EXPECT_EQ(checkpoint_tags(dir.path()), (std::vector<std::string>{"global_step1", "other"}));

  ResumeTrainer fresh(RunSetup{"fp32", true, 4});
  const auto loaded = fresh.engine.load_checkpoint(dir.path());
  EXPECT_EQ(loaded.path, path);
  EXPECT_EQ(loaded.client_state.at("epoch").toInt(), 3);
  EXPECT_EQ(loaded.client_state.at("position").toInt(), 1234);
  EXPECT_TRUE(torch::equal(loaded.client_state.at("rng").toTensor(),
                           at::detail::getDefaultCPUGenerator().get_state()));
}

TEST(Checkpoint, AConfigBuiltInCppSavesItsBatchSizesAndLoads) {
  testing::ScratchDir dir("stepwise-ckpt-cpp-config");
  Config config;  // no JSON: json_text is empty
  config.train_micro_batch_size_per_gpu = 2;
  config.gradient_accumulation_steps = 2;
  config.optimizer = OptimizerOptions().type("SGD").lr(0.1);
  torch::manual_seed(0);
  torch::nn::Linear model(3, 1);
  auto engine = initialize(model, config);
  for (int i = 0; i < 2; ++i) {
    engine.backward(model->forward(torch::ones({2, 3})).pow(2).mean());
    engine.step();
  }
  const std::string path = engine.save_checkpoint(dir.path());
  std::ifstream in(fs::path(path) / "mp_rank_00_model_states.pt", std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  const auto saved = torch::pickle_load(bytes).toGenericDict();
  EXPECT_EQ(saved.at("ds_config").toStringRef(),
            R"({"gradient_accumulation_steps":2,"train_batch_size":4,)"
            R"("train_micro_batch_size_per_gpu":2})");
  torch::nn::Linear other(3, 1);
  auto resumed = initialize(other, config);
  resumed.load_checkpoint(dir.path());
  EXPECT_EQ(resumed.global_steps(), 1);
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
}

TEST(Checkpoint, MissingTagAndLatestListTheTagsPresent) {
  testing::ScratchDir dir("stepwise-ckpt-missing");
  ResumeTrainer r(RunSetup{"fp32", false, 1});
  EXPECT_EQ(testing::error_of<CheckpointError>([&] { r.engine.load_checkpoint(dir.path()); }),
            c10::str("no file ", (fs::path(dir.path()) / "latest").string(),
                     " names the checkpoint to load: pass LoadOptions().tag(...); no checkpoint "
                     "is in ",
                     dir.path()));
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("a").save_latest(false));
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("b").save_latest(false));
  EXPECT_EQ(testing::error_of<CheckpointError>(
                [&] { r.engine.load_checkpoint(dir.path(), LoadOptions().tag("c")); }),
            c10::str("no checkpoint \"c\" in ", dir.path(), ": the tags present are: a b"));
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              r.engine.save_checkpoint(dir.path(), SaveOptions().tag("x/y"));
            }).find("checkpoint tag \"x/y\" (3 bytes) cannot name a folder"),
            std::string::npos);
}

TEST(Checkpoint, TruncatedOrCorruptedFilesAreNamed) {
  testing::ScratchDir dir("stepwise-ckpt-corrupt");
  ResumeTrainer r(RunSetup{"fp32", true, 4});
  for (int64_t t = 0; t < 5; ++t) r.micro_step(t);
  const std::string path = r.engine.save_checkpoint(dir.path());
  const std::string file = (fs::path(path) / "mp_rank_00_model_states.pt").string();
  const auto size = fs::file_size(file);
  const std::string before = r.engine.save_checkpoint(dir.path(), SaveOptions().tag("copy"));
  fs::resize_file(file, size / 2);
  ResumeTrainer fresh(RunSetup{"fp32", true, 4});
  const auto w = fresh.model->w.clone();
  const std::string error = testing::error_of<CheckpointError>(
      [&] { fresh.engine.load_checkpoint(dir.path(), LoadOptions().tag("global_step1")); });
  EXPECT_EQ(error.rfind(c10::str("checkpoint file ", file, " (", size / 2,
                                 " bytes) is truncated or corrupted: "),
                        0),
            0u)
      << error;
  // A flipped byte in the middle of the tensor data (the zip's CRC catches it).
  const std::string other = (fs::path(before) / "mp_rank_00_model_states.pt").string();
  {
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(other) / 2));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(fs::file_size(other) / 2));
    f.put(static_cast<char>(c ^ 0x5a));
  }
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              fresh.engine.load_checkpoint(dir.path(), LoadOptions().tag("copy"));
            }).find("checkpoint file " + other),
            std::string::npos);
  EXPECT_TRUE(torch::equal(fresh.model->w, w)) << "a failed load changes nothing";
  EXPECT_EQ(fresh.engine.micro_steps(), 0);
  // The top bit of two 8-byte words one hash block (32 bytes) apart: a hash that only
  // multiplies would see both flips cancel. The checksum catches them.
  const std::string twice =
      (fs::path(r.engine.save_checkpoint(dir.path(), SaveOptions().tag("twice"))) /
       "mp_rank_00_model_states.pt")
          .string();
  const auto at = static_cast<std::streamoff>(fs::file_size(twice) / 2 / 32 * 32 + 7);
  for (std::streamoff offset : {at, at + 32}) {
    std::fstream f(twice, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c;
    f.get(c);
    f.seekp(offset);
    f.put(static_cast<char>(c ^ '\x80'));
  }
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              fresh.engine.load_checkpoint(dir.path(), LoadOptions().tag("twice"));
            }).find("its checksum differs from the one written with it"),
            std::string::npos);
  // A sidecar in the format of an older stepwise ("<size> <hash>", another hash) is refused
  // by name, not reported as corruption.
  const std::string old_format =
      (fs::path(r.engine.save_checkpoint(dir.path(), SaveOptions().tag("old"))) /
       "mp_rank_00_model_states.pt")
          .string();
  std::ofstream(old_format + ".sum") << fs::file_size(old_format) << " 12345\n";
  EXPECT_EQ(testing::error_of<CheckpointError>(
                [&] { fresh.engine.load_checkpoint(dir.path(), LoadOptions().tag("old")); }),
            c10::str("checkpoint file ", old_format,
                     ".sum was written by an older stepwise (its checksum is not xxh3): load "
                     "the checkpoint with the stepwise that saved it and save it again"));
  EXPECT_TRUE(torch::equal(fresh.model->w, w)) << "a failed load changes nothing";
}

struct OtherModelImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::zeros({5}));
  torch::Tensor b = register_parameter("b", torch::zeros({1}));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1) + b; }
};
TORCH_MODULE(OtherModel);

TEST(Checkpoint, AModelThatDoesNotFitIsNamedAndLeftUnchanged) {
  testing::ScratchDir dir("stepwise-ckpt-shape");
  ResumeTrainer r(RunSetup{"fp32", false, 2});
  for (int64_t t = 0; t < 3; ++t) r.micro_step(t);
  r.engine.save_checkpoint(dir.path());
  OtherModel other;
  auto engine = initialize(other, Config::from_string(config_json(RunSetup{"fp32", false, 2})));
  const std::string file =
      (fs::path(dir.path()) / "global_step1" / "mp_rank_00_model_states.pt").string();
  EXPECT_EQ(testing::error_of<CheckpointError>([&] { engine.load_checkpoint(dir.path()); }),
            c10::str("parameter \"w\" has shape [4] in ", file, " but [5] in this model"));
  EXPECT_TRUE(torch::equal(other->w, torch::zeros({5})));
  // A model with a parameter the checkpoint lacks: strict names it; non-strict loads the rest.
  struct WiderImpl : ScaleModelImpl {
    torch::Tensor extra = register_parameter("extra", torch::ones({2}));
  };
  auto wider = std::make_shared<WiderImpl>();
  auto e2 = initialize(wider, Config::from_string(config_json(RunSetup{"fp32", false, 2})));
  EXPECT_EQ(testing::error_of<CheckpointError>([&] { e2.load_checkpoint(dir.path()); }),
            c10::str("parameter or buffer \"extra\" of this model is not in ", file,
                     ": load the checkpoint of the same model, or pass "
                     "LoadOptions().load_module_strict(false) to keep its current value"));
  // (its optimizer has another parameter count: the optimizer state cannot load either)
  e2.load_checkpoint(dir.path(),
                     LoadOptions().load_module_strict(false).load_optimizer_states(false));
  EXPECT_TRUE(torch::equal(wider->w, r.model->w));
  EXPECT_TRUE(torch::equal(wider->extra, torch::ones({2})));
}

TEST(Checkpoint, MidWindowNeedsTheSameSetupABoundaryDoesNot) {
  testing::ScratchDir dir("stepwise-ckpt-setup");
  ResumeTrainer r(RunSetup{"fp32", false, 4});
  for (int64_t t = 0; t < 6; ++t) r.micro_step(t);  // 2 pending
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("mid"));
  r.engine.flush();  // a boundary
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("boundary"));

  ResumeTrainer gas2(RunSetup{"fp32", false, 2});
  EXPECT_EQ(testing::error_of<CheckpointError>(
                [&] { gas2.engine.load_checkpoint(dir.path(), LoadOptions().tag("mid")); }),
            c10::str("checkpoint ", (fs::path(dir.path()) / "mid").string(),
                     " was saved inside an accumulation window (2 micro-batches pending) with "
                     "gradient_accumulation_steps 4 (now 2): its pending gradients belong to "
                     "that setup. Resume it with the same GAS, world size and precision, or "
                     "save at a boundary (a different world size is allowed there), or pass "
                     "LoadOptions().load_window(false) to drop them"));
  ResumeTrainer bf16(RunSetup{"bf16", false, 4});
  EXPECT_NE(testing::error_of<CheckpointError>([&] {
              bf16.engine.load_checkpoint(dir.path(), LoadOptions().tag("mid"));
            }).find("with precision fp32 (now bf16)"),
            std::string::npos);
  // At the boundary: another GAS and another precision load, the weights exactly.
  gas2.engine.load_checkpoint(dir.path(), LoadOptions().tag("boundary"));
  EXPECT_TRUE(torch::equal(gas2.model->w, r.model->w));
  EXPECT_EQ(gas2.engine.global_steps(), 2);
  EXPECT_EQ(gas2.engine.micro_steps(), 8);
  bf16.engine.load_checkpoint(dir.path(), LoadOptions().tag("boundary"));
  EXPECT_TRUE(torch::equal(bf16.engine.master_params()[0], r.model->w));
}

TEST(Checkpoint, ModuleOnlyAndOptimizerOfAnotherType) {
  testing::ScratchDir dir("stepwise-ckpt-module-only");
  ResumeTrainer r(RunSetup{"fp32", true, 2});
  for (int64_t t = 0; t < 5; ++t) r.micro_step(t);
  r.engine.save_checkpoint(dir.path());
  RunSetup sgd{"fp32", true, 2, "SGD"};
  ResumeTrainer other(sgd);
  EXPECT_NE(testing::error_of<CheckpointError>([&] { other.engine.load_checkpoint(dir.path()); })
                .find("holds the state of a torch::optim::AdamW; this engine's optimizer is a "
                      "torch::optim::SGD"),
            std::string::npos);
  EXPECT_EQ(other.engine.global_steps(), 0);
  other.engine.load_checkpoint(dir.path(), LoadOptions().load_module_only(true));
  EXPECT_TRUE(torch::equal(other.model->w, r.model->w));
  EXPECT_EQ(other.engine.global_steps(), 0) << "module only: the counters stay";
  EXPECT_FALSE(other.model->w.grad().defined());
}

TEST(Checkpoint, FusedAndTorchAdamResumeExactlyThroughFp16Overflows) {
  // A loss scale of 2^24 overflows fp16 at first: skipped steps, the scale halving after
  // its hysteresis. The scaler's state (scale, iteration, last overflow, hysteresis left)
  // is what makes the resumed run skip the same steps.
  testing::ScratchDir dir("stepwise-ckpt-overflow");
  const int64_t total = 16;
  for (const std::string torch_adam : {"false", "true"}) {
    RunSetup s{"fp16", true, 2, "Adam"};
    s.optimizer_params = c10::str(R"(, "torch_adam": )", torch_adam);
    s.fp16 = R"("initial_scale_power": 24, "hysteresis": 2, "loss_scale_window": 3)";
    ResumeTrainer whole(s);
    EXPECT_EQ(dynamic_cast<FusedAdamW*>(&whole.engine.optimizer()) != nullptr,
              torch_adam == "false");
    for (int64_t t = 0; t < total; ++t) whole.micro_step(t);
    ASSERT_GE(whole.engine.skipped_steps(), 2) << "the test needs overflows";
    for (int64_t k = 1; k < total; ++k) {
      ResumeTrainer first(s);
      for (int64_t t = 0; t < k; ++t) first.micro_step(t);
      first.engine.save_checkpoint(dir.path());
      ResumeTrainer resumed(s);
      resumed.engine.load_checkpoint(dir.path());
      EXPECT_EQ(resumed.engine.loss_scale(), first.engine.loss_scale());
      for (int64_t t = k; t < total; ++t) resumed.micro_step(t);
      expect_same(whole, resumed, c10::str("torch_adam ", torch_adam, " saved after ", k, ": "));
    }
  }
}

TEST(Checkpoint, TheSchedulersLrLoadsWithoutTheOptimizersState) {
  testing::ScratchDir dir("stepwise-ckpt-lr");
  ResumeTrainer r(RunSetup{"fp32", true, 2});
  for (int64_t t = 0; t < 8; ++t) r.micro_step(t);
  r.engine.save_checkpoint(dir.path());
  ResumeTrainer fresh(RunSetup{"fp32", true, 2});
  ASSERT_NE(fresh.engine.get_lr(), r.engine.get_lr());
  fresh.engine.load_checkpoint(dir.path(), LoadOptions().load_optimizer_states(false));
  EXPECT_EQ(fresh.engine.get_lr(), r.engine.get_lr()) << "the schedule's lr at its position";
  // A client scheduler (StepLR): its lr is the saved one.
  auto build = [](ScaleModel& model) {
    auto optimizer =
        std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
    auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 1, 0.5);
    return initialize(model, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1, "steps_per_print": 1000000})"),
                      std::move(optimizer), std::move(scheduler));
  };
  ScaleModel m1, m2;
  auto stepped = build(m1);
  for (int t = 0; t < 3; ++t) {
    stepped.backward(m1->forward(torch::ones({2, 4})).pow(2).mean());
    stepped.step();
  }
  stepped.save_checkpoint(dir.path(), SaveOptions().tag("steplr"));
  auto loaded = build(m2);
  loaded.load_checkpoint(dir.path(), LoadOptions().tag("steplr").load_optimizer_states(false));
  EXPECT_EQ(loaded.get_lr(), stepped.get_lr());
  EXPECT_DOUBLE_EQ(loaded.get_lr()[0], 0.1 / 4) << "LibTorch's StepLR halves from its 2nd step";
}

TEST(Checkpoint, ADroppedWindowAndAManualBoundaryLoadAsDocumented) {
  testing::ScratchDir dir("stepwise-ckpt-drop");
  ResumeTrainer r(RunSetup{"fp32", false, 4});
  for (int64_t t = 0; t < 6; ++t) r.micro_step(t);  // boundary at 4, then 3 of the next window
  r.engine.backward(r.model->forward(torch::ones({2, 4})).pow(2).mean());
  r.engine.step();  // micro_steps 7
  r.engine.save_checkpoint(dir.path(), SaveOptions().tag("mid"));
  // load_window(false): back to the window's start (4), then whole windows of this GAS.
  for (const auto& [gas, expected] : {std::pair<int64_t, int64_t>{4, 4}, {3, 6}, {2, 4}}) {
    ResumeTrainer t(RunSetup{"fp32", false, gas});
    t.engine.load_checkpoint(dir.path(), LoadOptions().tag("mid").load_window(false));
    EXPECT_EQ(t.engine.micro_steps(), expected) << "GAS " << gas;
    EXPECT_FALSE(t.model->w.grad().defined());
  }
  // A boundary set by hand is part of the state: it survives a load at a boundary.
  ResumeTrainer manual(RunSetup{"fp32", false, 4});
  manual.engine.set_gradient_accumulation_boundary(false);
  manual.micro_step(0);
  manual.engine.set_gradient_accumulation_boundary(true);
  manual.micro_step(1);  // ends the window by hand
  manual.engine.save_checkpoint(dir.path(), SaveOptions().tag("manual"));
  ResumeTrainer loaded(RunSetup{"fp32", false, 4});
  loaded.engine.load_checkpoint(dir.path(), LoadOptions().tag("manual"));
  EXPECT_TRUE(loaded.engine.is_gradient_accumulation_boundary());
  EXPECT_EQ(loaded.engine.micro_steps(), manual.engine.micro_steps());
  EXPECT_TRUE(torch::equal(loaded.engine.window_loss(), manual.engine.window_loss()));
}

TEST(Checkpoint, GuardRailsStillWorkAfterALoad) {
  testing::ScratchDir dir("stepwise-ckpt-guards");
  ResumeTrainer r(RunSetup{"fp32", false, 4});
  for (int64_t t = 0; t < 2; ++t) r.micro_step(t);
  r.engine.save_checkpoint(dir.path());
  ResumeTrainer fresh(RunSetup{"fp32", false, 4});
  fresh.engine.load_checkpoint(dir.path());
  fresh.model->zero_grad();
  EXPECT_NE(testing::error_of<UsageError>([&] {
              fresh.micro_step(2);
            }).find("between two micro-steps of an accumulation window"),
            std::string::npos);
}

}  // namespace
}  // namespace stepwise

namespace stepwise {
namespace {

// STEPWISE_TEST_PYTHON (a CMake cache variable; Debian's /usr/bin/python3 by default) must
// import torch.
bool python_has_torch() {
  return std::system(STEPWISE_TEST_PYTHON " -c 'import torch' 2>/dev/null") == 0;
}
const char* const kNoPythonTorch = STEPWISE_TEST_PYTHON
    " cannot import torch: run tools/bootstrap (it installs Debian's "
    "python3-torch), or configure with -DSTEPWISE_TEST_PYTHON=<a python "
    "with torch>";

TEST(Checkpoint, PythonPyTorchReadsTheFiles) {
  // Python's torch (Debian's python3-torch: tools/bootstrap installs it) reads what
  // torch::pickle_save wrote.
  ASSERT_TRUE(python_has_torch()) << kNoPythonTorch;
  testing::ScratchDir dir("stepwise-ckpt-python");
  ResumeTrainer r(RunSetup{"fp32", true, 4});
  for (int64_t t = 0; t < 6; ++t) r.micro_step(t);
  const std::string path =
      r.engine.save_checkpoint(dir.path(), SaveOptions().client_state({{"epoch", 7}}));
  const std::string expected = dir.path() + "/expected.txt";
  {
    std::ofstream out(expected);
    auto line = [&](const std::string& key, const torch::Tensor& t) {
      out << key;
      const auto flat = t.detach().to(torch::kFloat).flatten();
      for (int64_t i = 0; i < flat.numel(); ++i) {
        out << ' ' << std::setprecision(9) << flat[i].item<float>();
      }
      out << '\n';
    };
    line("w", r.model->w);
    line("b", r.model->b);
    line("grad w", r.model->w.grad());
    out << "int global_steps " << r.engine.global_steps() << "\n";
    out << "int micro_steps " << r.engine.micro_steps() << "\n";
  }
  const std::string command = c10::str(
      STEPWISE_TEST_PYTHON, " ", STEPWISE_SOURCE_DIR, "/tests/checkpoint/read_with_pytorch.py ",
      path, "/mp_rank_00_model_states.pt ", path, "/window_rank_0.pt ", expected);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

TEST(Checkpoint, ADeepSpeedCheckpointConvertsAndLoads) {
  // A file in DeepSpeed's stage-0 layout, written by PyTorch (a Python set and torch.Size
  // objects included), converted by tools/deepspeed-to-stepwise, loaded into an engine.
  ASSERT_TRUE(python_has_torch()) << kNoPythonTorch;
  testing::ScratchDir dir("stepwise-ckpt-deepspeed");
  const std::string ds = dir.path() + "/ds", converted = dir.path() + "/converted";
  const std::string make = c10::str(STEPWISE_TEST_PYTHON, " ", STEPWISE_SOURCE_DIR,
                                    "/tests/checkpoint/make_deepspeed_checkpoint.py ", ds);
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  // LibTorch's own unpickler cannot read DeepSpeed's file (its Python set): hence the tool.
  {
    std::ifstream in(ds + "/global_step2/mp_rank_00_model_states.pt", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_ANY_THROW(torch::pickle_load(bytes));
  }
  const std::string convert = c10::str(STEPWISE_TEST_PYTHON, " ", STEPWISE_SOURCE_DIR,
                                       "/tools/deepspeed-to-stepwise ", ds, " ", converted);
  ASSERT_EQ(std::system(convert.c_str()), 0) << convert;

  torch::nn::Linear model(4, 1);
  auto engine = initialize(model, Config::from_string(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 4, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.5}}})"));
  const auto loaded = engine.load_checkpoint(converted);
  EXPECT_EQ(loaded.path, converted + "/global_step2");
  std::map<std::string, torch::Tensor> expected;
  std::ifstream lines(ds + "/expected.txt");
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name == "int") continue;
    std::vector<float> values;
    for (float v; words >> v;) values.push_back(v);
    expected[name] = torch::tensor(values);
  }
  EXPECT_TRUE(torch::equal(model->weight.flatten(), expected.at("weight")));
  EXPECT_TRUE(torch::equal(model->bias.flatten(), expected.at("bias")));
  // state() is keyed by the TensorImpl* printed to a string in LibTorch 1.13 and by the
  // pointer itself in 2.x (see NOTE: [optimizer state key] in src/torch_compat.h).
  const auto& states = engine.optimizer().state();
  // A generic lambda, so that only the branch of this LibTorch's key type is compiled.
  const auto find_state = [](const auto& map, const torch::Tensor& param) {
    using Key = typename std::decay_t<decltype(map)>::key_type;
    if constexpr (std::is_same_v<Key, std::string>) {
      std::ostringstream key;
      key << static_cast<void*>(param.unsafeGetTensorImpl());
      return map.find(key.str());
    } else {
      return map.find(static_cast<Key>(param.unsafeGetTensorImpl()));
    }
  };
  const auto state_it = find_state(states, model->weight);
  ASSERT_NE(state_it, states.end());
  const auto& state = static_cast<const torch::optim::AdamWParamState&>(*state_it->second);
  EXPECT_EQ(state.step(), 2);
  EXPECT_TRUE(torch::equal(state.exp_avg().flatten(), expected.at("exp_avg/0")));
  EXPECT_TRUE(torch::equal(state.exp_avg_sq().flatten(), expected.at("exp_avg_sq/0")));
  EXPECT_DOUBLE_EQ(engine.get_lr()[0], 0.01) << "the saved lr, not the config's";
  EXPECT_EQ(engine.global_steps(), 2);
  EXPECT_EQ(engine.global_samples(), 16);
  EXPECT_EQ(engine.micro_steps(), 8) << "DeepSpeed saves no micro_steps: global_steps x GAS";
  // And it trains on.
  engine.backward(model->forward(torch::ones({2, 4})).pow(2).mean());
  engine.step();
  // A ZeRO checkpoint (its optimizer state in per-rank zero_pp_rank_* files) is refused.
  std::ofstream(ds + "/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.pt") << "x";
  const std::string zero = convert + "-zero 2>" + dir.path() + "/zero.txt";
  EXPECT_NE(std::system(zero.c_str()), 0);
  std::ifstream zero_out(dir.path() + "/zero.txt");
  const std::string message((std::istreambuf_iterator<char>(zero_out)),
                            std::istreambuf_iterator<char>());
  EXPECT_NE(message.find("is a ZeRO stage 1+ checkpoint"), std::string::npos) << message;
}

}  // namespace
}  // namespace stepwise
