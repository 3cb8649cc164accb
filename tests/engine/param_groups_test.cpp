// Parameter groups: the config's optimizer over groups equals LibTorch's optimizer with
// the same groups written by hand; the usual weight-decay split; the errors; groups under
// bf16, under a schedule and in checkpoints.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include <set>

#include "support/error_of.h"
#include "support/scratch_dir.h"

namespace stepwise {
namespace {

using testing::error_of;

// Linear -> LayerNorm -> Linear: weights that decay, biases and a norm that do not.
struct SmallNetImpl : torch::nn::Module {
  torch::nn::Linear in = register_module("in", torch::nn::Linear(4, 8));
  torch::nn::LayerNorm norm =
      register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
  torch::nn::Linear out = register_module("out", torch::nn::Linear(8, 1));
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(norm(in(x)))); }
};
TORCH_MODULE(SmallNet);

SmallNet seeded_net() {
  torch::manual_seed(3);
  return SmallNet();
}

Config config_with(const std::string& optimizer, int64_t gas = 2, const std::string& more = "") {
  return Config::from_string(c10::str(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": )",
                                      gas, R"(, "steps_per_print": 1000000, "optimizer": )",
                                      optimizer, more, "}"));
}

torch::Tensor micro_batch_loss(SmallNet& net, int64_t t) {
  torch::manual_seed(100 + t);
  const auto dtype = net->in->weight.scalar_type();  // bf16 under bf16
  const auto x = torch::randn({2, 4}).to(dtype);
  const auto y = torch::randn({2, 1}).to(dtype);
  return (net->forward(x) - y).pow(2).mean();  // mse_loss has no bf16 kernel on the CPU
}

// `windows` windows of GAS 2 through the engine.
void train(SmallNet& net, Engine& engine, int64_t windows) {
  for (int64_t t = 0; t < 2 * windows; ++t) {
    engine.backward(micro_batch_loss(net, t));
    engine.step();
  }
}

// The same windows by hand: loss / GAS, accumulate, step, zero the gradients.
void train_by_hand(SmallNet& net, torch::optim::Optimizer& optimizer, int64_t windows) {
  for (int64_t t = 0; t < 2 * windows; ++t) {
    (micro_batch_loss(net, t) / 2).backward();
    if (t % 2 == 1) {
      optimizer.step();
      optimizer.zero_grad();
    }
  }
}

std::vector<torch::Tensor> decaying(SmallNet& net) { return {net->in->weight, net->out->weight}; }
std::vector<torch::Tensor> not_decaying(SmallNet& net) {
  return {net->in->bias, net->norm->weight, net->norm->bias, net->out->bias};
}

void expect_same_weights(SmallNet& a, SmallNet& b, double tolerance = 0.0) {
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (tolerance == 0.0) {
      EXPECT_TRUE(torch::equal(pa[i].value(), pb[i].value())) << pa[i].key();
    } else {
      EXPECT_TRUE(torch::allclose(pa[i].value(), pb[i].value(), tolerance, tolerance))
          << pa[i].key() << " differs by "
          << (pa[i].value() - pb[i].value()).abs().max().item<double>();
    }
  }
}

TEST(ParamGroups, ConfigAdamWEqualsTorchAdamWWithTheSameGroupsByHand) {
  for (bool fused : {false, true}) {
    SmallNet net = seeded_net();
    auto engine = initialize(net,
                             config_with(c10::str(R"({"type": "AdamW", "params": {"lr": 0.01,
                                 "weight_decay": 0.1, "torch_adam": )",
                                                  fused ? "false" : "true", "}}")),
                             weight_decay_groups(*net));
    train(net, engine, 6);

    SmallNet by_hand = seeded_net();
    torch::optim::AdamW optimizer(
        {torch::optim::OptimizerParamGroup(decaying(by_hand)),
         torch::optim::OptimizerParamGroup(
             not_decaying(by_hand), std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(0.01).weight_decay(0.0)))},
        torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    train_by_hand(by_hand, optimizer, 6);
    SCOPED_TRACE(fused ? "FusedAdamW" : "torch::optim::AdamW");
    // LibTorch's AdamW: the same operations, bit for bit; the fused update rounds
    // differently in the last bits.
    expect_same_weights(net, by_hand, fused ? 1e-6 : 0.0);
    ASSERT_EQ(engine.optimizer().param_groups().size(), 2u);
    EXPECT_EQ(engine.optimizer().param_groups()[1].options().get_lr(), 0.01);
  }
}

TEST(ParamGroups, EachGroupsOwnLrAndMomentumInSgd) {
  SmallNet net = seeded_net();
  std::vector<ParamGroup> groups{ParamGroup(decaying(net)),
                                 ParamGroup(not_decaying(net)).lr(0.5).momentum(0.0)};
  auto engine = initialize(
      net, config_with(R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}})"), groups);
  train(net, engine, 5);

  SmallNet by_hand = seeded_net();
  torch::optim::SGD optimizer(
      {torch::optim::OptimizerParamGroup(decaying(by_hand)),
       torch::optim::OptimizerParamGroup(not_decaying(by_hand),
                                         std::make_unique<torch::optim::SGDOptions>(
                                             torch::optim::SGDOptions(0.5).momentum(0.0)))},
      torch::optim::SGDOptions(0.05).momentum(0.9));
  train_by_hand(by_hand, optimizer, 5);
  expect_same_weights(net, by_hand);
}

// A module named "final_norm" of a plain type, an RMSNorm of your own, an embedding, and
// a frozen parameter.
struct RMSNormImpl : torch::nn::Module {
  torch::Tensor weight = register_parameter("weight", torch::ones({4}));
  torch::Tensor forward(const torch::Tensor& x) { return x * weight; }
};
TORCH_MODULE(RMSNorm);

struct ScaleImpl : torch::nn::Module {
  torch::Tensor scale = register_parameter("scale", torch::ones({4}));
};
TORCH_MODULE(Scale);

struct MixedNetImpl : torch::nn::Module {
  torch::nn::Embedding embed = register_module("embed", torch::nn::Embedding(10, 4));
  torch::nn::Linear proj = register_module("proj", torch::nn::Linear(4, 4));
  RMSNorm rms = register_module("rms", RMSNorm());
  Scale final_norm = register_module("final_norm", Scale());
  Scale gain = register_module("gain", Scale());
  torch::nn::BatchNorm1d batch = register_module("batch", torch::nn::BatchNorm1d(4));
  torch::Tensor frozen = register_parameter("frozen", torch::ones({2}), /*requires_grad=*/false);
};
TORCH_MODULE(MixedNet);

std::set<std::string> names_of(const torch::nn::Module& model, const ParamGroup& group) {
  std::set<std::string> out;
  for (const auto& item : model.named_parameters()) {
    for (const auto& p : group.params) {
      if (p.is_same(item.value())) out.insert(item.key());
    }
  }
  return out;
}

TEST(ParamGroups, WeightDecayGroupsLeaveBiasesAndNormsOut) {
  MixedNet net;
  const auto groups = weight_decay_groups(*net);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(names_of(*net, groups[0]),
            (std::set<std::string>{"embed.weight", "proj.weight", "gain.scale"}));
  EXPECT_FALSE(groups[0].weight_decay().has_value());  // the optimizer's
  EXPECT_EQ(names_of(*net, groups[1]),
            (std::set<std::string>{"proj.bias", "rms.weight", "final_norm.scale", "batch.weight",
                                   "batch.bias"}));
  EXPECT_EQ(groups[1].weight_decay(), 0.0);
  // A model with no bias and no norm: one group, none empty.
  torch::nn::Linear no_bias(torch::nn::LinearOptions(3, 2).bias(false));
  EXPECT_EQ(weight_decay_groups(*no_bias).size(), 1u);
}

TEST(ParamGroups, GroupsThatDoNotCoverTheModelOnceAreNamed) {
  const auto adamw = R"({"type": "AdamW", "params": {"lr": 0.01}})";
  SmallNet net = seeded_net();
  EXPECT_EQ(error_of<ConfigError>(
                [&] { initialize(net, config_with(adamw), {ParamGroup(decaying(net))}); }),
            "\"in.bias\" requires grad but is in no parameter group, so it would never be "
            "updated: add it to a group, or freeze it with requires_grad(false)");
  EXPECT_EQ(error_of<ConfigError>([&] {
              initialize(net, config_with(adamw),
                         {ParamGroup(net->parameters()), ParamGroup({net->out->bias})});
            }),
            "\"out.bias\" is in parameter group 0 and in group 1: put each parameter in one group");
  EXPECT_EQ(error_of<ConfigError>([&] {
              initialize(net, config_with(adamw),
                         {ParamGroup(net->parameters()), ParamGroup({torch::zeros({2})})});
            }),
            "parameter group 1 holds a tensor (0 in the group) that is not a parameter of the "
            "model: build the groups from model->named_parameters() or model->parameters()");
  EXPECT_EQ(error_of<ConfigError>([&] {
              initialize(net, config_with(adamw),
                         {ParamGroup(decaying(net)), ParamGroup(not_decaying(net)).lr(-1.0)});
            }).rfind("parameter group 1: lr ", 0),
            0u);
  EXPECT_NE(error_of<ConfigError>([&] {
              initialize(
                  net,
                  Config::from_string(
                      R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000000})"),
                  weight_decay_groups(*net));
            }).find("parameter groups were given, but the config has no \"optimizer\" section"),
            std::string::npos);
}

TEST(ParamGroups, UnderBf16TheGroupsHoldTheMastersAndAScheduleSetsEveryGroupsLr) {
  SmallNet net = seeded_net();
  auto engine = initialize(
      net,
      config_with(R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})", 2,
                  R"(, "bf16": {"enabled": true},
                      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02,
                                    "warmup_num_steps": 10}})"),
      {ParamGroup(decaying(net)), ParamGroup(not_decaying(net)).weight_decay(0.0).lr(0.5)});
  train(net, engine, 3);
  const auto& groups = engine.optimizer().param_groups();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].params().size(), 4u);
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat);  // a master, not the bf16 parameter
      bool is_master = false;
      for (const auto& m : engine.master_params()) is_master = is_master || m.is_same(p);
      EXPECT_TRUE(is_master);
    }
  }
  EXPECT_EQ(net->in->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[1].options()).weight_decay(),
            0.0);
  // WarmupLR sets every group's lr to the schedule's, its own 0.5 included (DeepSpeed's too).
  const auto lrs = engine.get_lr();
  ASSERT_EQ(lrs.size(), 2u);
  EXPECT_EQ(lrs[0], lrs[1]);
  EXPECT_LT(lrs[1], 0.02);
}

TEST(ParamGroups, CheckpointsResumeTheGroupsAndRefuseOtherGroups) {
  testing::ScratchDir dir("stepwise-param-groups");
  const auto adamw = R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  SmallNet whole_net = seeded_net();
  auto whole = initialize(whole_net, config_with(adamw), weight_decay_groups(*whole_net));
  train(whole_net, whole, 4);

  SmallNet first_net = seeded_net();
  auto first = initialize(first_net, config_with(adamw), weight_decay_groups(*first_net));
  for (int64_t t = 0; t < 3; ++t) {  // inside the second window
    first.backward(micro_batch_loss(first_net, t));
    first.step();
  }
  first.save_checkpoint(dir.path());
  SmallNet resumed_net;
  auto resumed = initialize(resumed_net, config_with(adamw), weight_decay_groups(*resumed_net));
  resumed.load_checkpoint(dir.path());
  for (int64_t t = 3; t < 8; ++t) {
    resumed.backward(micro_batch_loss(resumed_net, t));
    resumed.step();
  }
  expect_same_weights(resumed_net, whole_net);

  SmallNet one_group_net;
  auto one_group = initialize(one_group_net, config_with(adamw));
  EXPECT_NE(error_of<CheckpointError>([&] {
              one_group.load_checkpoint(dir.path());
            }).find("it has 2 parameter groups, this optimizer 1"),
            std::string::npos);
}

}  // namespace
}  // namespace stepwise
