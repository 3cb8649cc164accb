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
  std::vector<LambReference> cases(6);
  cases[1].weight_decay = 0.1;
  cases[2].bias_correction = false;
  cases[3].eps_inside_sqrt = true;
  cases[3].eps = 1e-3;
  cases[4].max_coeff = 0.5;  // the cap binds
  cases[5].min_coeff = 5.0;  // the floor binds
  cases[5].lr = 0.01;
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

TEST(Lamb, ItsStateAndOptionsRoundTripAndItsKeysAreChecked) {
  torch::manual_seed(2);
  auto a = torch::randn({5}, torch::requires_grad());
  auto lamb = make_optimizer(
      OptimizerOptions("Lamb").lr(0.01).max_coeff(2.0).min_coeff(0.1).eps_inside_sqrt(true), {a});
  a.mutable_grad() = torch::ones({5});
  lamb->step();
  torch::serialize::OutputArchive out;
  lamb->save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  auto b = a.detach().clone().requires_grad_(true);
  auto again = make_optimizer(
      OptimizerOptions("Lamb").lr(0.01).max_coeff(2.0).min_coeff(0.1).eps_inside_sqrt(true), {b});
  torch::serialize::InputArchive in;
  std::istringstream from(bytes.str());
  in.load_from(from);
  again->load(in);
  a.mutable_grad() = torch::full({5}, 0.5);
  b.mutable_grad() = torch::full({5}, 0.5);
  lamb->step();
  again->step();
  EXPECT_TRUE(torch::equal(a, b)) << "the second step from the loaded state";
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
}

}  // namespace
}  // namespace stepwise
