// "type": "Lamb": the update of DeepSpeed's FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu,
// from You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
// minutes"), against a reference written out here in double, tensor by tensor.
#include <stepwise/stepwise.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace stepwise {
namespace {

struct LambReference {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool bias_correction = true, eps_inside_sqrt = false;
  double max_coeff = 10.0, min_coeff = 0.01;

  // One step of one tensor: Adam's moments; update = m / denom + wd * w; the trust ratio
  // ||w|| / ||update|| (1 if either is 0) capped at max_coeff, then floored at min_coeff;
  // w -= step_size * ratio * update, with the bias correction in the step size only.
  void step(torch::Tensor& w, torch::Tensor& m, torch::Tensor& v, const torch::Tensor& g,
            int64_t t) const {
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const auto denom = eps_inside_sqrt ? (v + eps).sqrt() : v.sqrt() + eps;
    const auto update = m / denom + weight_decay * w;
    const double w_norm = w.norm().item<double>(), u_norm = update.norm().item<double>();
    double ratio = 1.0;
    if (w_norm != 0 && u_norm != 0)
      ratio = std::max(std::min(w_norm / u_norm, max_coeff), min_coeff);
    const double step_size =
        bias_correction ? lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t)) : lr;
    w = w - step_size * ratio * update;
  }
};

std::string config_of(const LambReference& r) {
  return c10::str(R"({"train_batch_size": 1, "optimizer": {"type": "Lamb", "params": {"lr": )",
                  r.lr, R"(, "betas": [)", r.beta1, ", ", r.beta2, R"(], "eps": )", r.eps,
                  R"(, "weight_decay": )", r.weight_decay, R"(, "bias_correction": )",
                  r.bias_correction ? "true" : "false", R"(, "eps_inside_sqrt": )",
                  r.eps_inside_sqrt ? "true" : "false", R"(, "max_coeff": )", r.max_coeff,
                  R"(, "min_coeff": )", r.min_coeff, "}}}");
}

struct TwoTensors : torch::nn::Module {
  TwoTensors() {
    a = register_parameter("a", torch::randn({40}));
    b = register_parameter("b", torch::zeros({3}));  // ||w|| = 0 at first: ratio 1
  }
  torch::Tensor a, b;
};

// Through the engine, as a config names it: 8 steps of random gradients (the loss's
// gradient is `g`) against the reference, for the defaults and each option changed.
TEST(Lamb, TheConfigsLambIsDeepSpeedsFusedLamb) {
  // Tensor a's ratio is 0.26-0.46 here and b's (from 0) far below 0.01, so b is floored in
  // every case; case 4's cap binds a, and case 6 (floor above cap) takes the floor, as the
  // kernel's order (cap, then floor) gives.
  std::vector<LambReference> cases(7);
  cases[1].weight_decay = 0.1;
  cases[2].bias_correction = false;
  cases[3].eps_inside_sqrt = true;
  cases[3].eps = 1e-3;
  cases[4].max_coeff = 0.1;  // the cap binds
  cases[5].min_coeff = 5.0;  // the floor binds
  cases[5].lr = 0.01;
  cases[6].max_coeff = 0.1;  // both bind: the floor wins
  cases[6].min_coeff = 0.2;
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& r = cases[c];
    torch::manual_seed(11);
    auto model = std::make_shared<TwoTensors>();
    std::vector<torch::Tensor> w, m, v;
    for (const auto& p : model->parameters()) {
      w.push_back(p.detach().to(torch::kDouble));
      m.push_back(torch::zeros_like(w.back()));
      v.push_back(torch::zeros_like(w.back()));
    }
    auto engine = initialize(model, Config::from_string(config_of(r)));
    for (int64_t t = 1; t <= 8; ++t) {
      const auto ga = torch::randn({40}), gb = torch::randn({3});
      engine.backward((model->a * ga).sum() + (model->b * gb).sum());
      engine.step();
      r.step(w[0], m[0], v[0], ga.to(torch::kDouble), t);
      r.step(w[1], m[1], v[1], gb.to(torch::kDouble), t);
    }
    const auto params = model->parameters();
    for (size_t i = 0; i < 2; ++i) {
      const auto got = params[i].detach().to(torch::kDouble);
      EXPECT_TRUE(torch::allclose(got, w[i], 1e-5, 1e-7))
          << "case " << c << " tensor " << i << ": largest difference "
          << (got - w[i]).abs().max().item<double>();
    }
  }
}

// A checkpoint restores Lamb's state and every option: an engine built with other options
// resumes and continues bit for bit with the saved ones.
TEST(Lamb, ACheckpointRestoresItsStateAndOptionsAndItsKeysAreChecked) {
  const auto config = [](const char* params) {
    return Config::from_string(
        std::string(R"({"train_batch_size": 1, "optimizer": {"type": "Lamb", "params": )") +
        params + "}}");
  };
  const auto saved = config(R"({"lr": 0.01, "betas": [0.8, 0.9], "eps": 1e-3,
      "weight_decay": 0.1, "bias_correction": false, "eps_inside_sqrt": true,
      "max_coeff": 0.3, "min_coeff": 0.2})");
  const auto run = [](Engine& engine, TwoTensors& model, int from, int to) {
    for (int t = from; t < to; ++t) {
      torch::manual_seed(100 + t);
      engine.backward((model.a * torch::randn({40})).sum() + (model.b * torch::randn({3})).sum());
      engine.step();
    }
  };
  torch::manual_seed(4);
  auto whole = std::make_shared<TwoTensors>();
  auto resumed = std::make_shared<TwoTensors>();
  auto engine = initialize(whole, saved);
  run(engine, *whole, 0, 3);
  const auto dir = std::filesystem::temp_directory_path() / "stepwise-lamb-checkpoint";
  std::filesystem::remove_all(dir);
  engine.save_checkpoint(dir.string());
  run(engine, *whole, 3, 6);
  auto other = initialize(resumed, config(R"({"lr": 0.5, "max_coeff": 3.0})"));
  other.load_checkpoint(dir.string());
  EXPECT_EQ(other.optimizer().param_groups()[0].options().get_lr(), 0.01);
  run(other, *resumed, 3, 6);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(torch::equal(whole->a, resumed->a) && torch::equal(whole->b, resumed->b))
      << "the resumed run, with the saved options, ends as the uninterrupted one";
  const auto error_of = [](const std::string& params) {
    try {
      Config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "LAMB", "params": )" +
                          params + "}}");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error_of(R"({"lr": 0.01, "max_coeff": 0.3})"), "accepted") << "any case, as DeepSpeed";
  EXPECT_NE(error_of(R"({"amsgrad": true})").find("FusedLamb does not support the AMSGrad"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"torch_adam": true})").find("unknown key optimizer.params.torch_adam"),
            std::string::npos)
      << "FusedLamb takes no torch_adam: DeepSpeed fails with a TypeError";
  // The same in C++: Adam's switches are not Lamb's.
  for (const auto& options :
       {OptimizerOptions("Lamb").torch_adam(false), OptimizerOptions("Lamb").adam_w_mode(false)}) {
    try {
      validate(options);
      ADD_FAILURE() << "an Adam switch was taken for Lamb";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is set, but it is Adam's"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace stepwise
