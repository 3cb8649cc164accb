// Pitfall 5: the calls a ported loop leaves behind are refused (NOTE: [leftover calls]),
// each check has its opt-out, and a correct loop never trips one.
#include <stepwise/engine.h>

#include <gtest/gtest.h>
#include <torch/version.h>  // TORCH_VERSION_MAJOR

#include "support/error_of.h"
#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::reference_linear;
using testing::reference_samples;

std::string config(const std::string& optimizer, const std::string& stepwise_section = "{}") {
  return R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0, "steps_per_print": 1000,
      "optimizer": {"type": ")" +
         optimizer + R"(", "params": {"lr": 0.01}}, "stepwise": )" + stepwise_section + "}";
}

struct Trainer {
  torch::nn::Linear model = reference_linear();
  Engine engine;
  explicit Trainer(const std::string& json)
      : engine(initialize(model, Config::from_string(json))) {}
  torch::Tensor loss(int64_t t) {
    auto [x, y] = reference_samples(2 * t, 2);
    return torch::mse_loss(model->forward(x), y);
  }
  std::string usage_error(const std::function<void()>& f) {
    return testing::error_of<UsageError>(f);
  }
};

const char* kZeroGrad =
    "the gradient of parameter \"weight\" was cleared or replaced by another tensor (as "
    "zero_grad() does) between two micro-steps of an accumulation window (found by the "
    "backward() at micro_steps 1): remove the zero_grad() "
    "call (model->zero_grad() or optimizer.zero_grad()) from your loop. engine.step() sets the "
    "gradients to none after each optimizer step; clearing them inside a window throws away "
    "the micro-batches accumulated so far. See docs/gradient-accumulation.md (stepwise docs: "
    "The pitfalls of gradient accumulation), pitfall 5. To do this on purpose set \"stepwise\": "
    "{\"check_grads_cleared\": false}.";

TEST(LeftoverCalls, ZeroGradInsideAWindow) {
  Trainer r(config("AdamW"));
  r.engine.backward(r.loss(0));
  r.engine.step();
  r.model->zero_grad();  // LibTorch 1.13: detaches (a new tensor) and zeroes; 2.x: none
  EXPECT_EQ(r.usage_error([&] { r.engine.backward(r.loss(1)); }), kZeroGrad);
}

TEST(LeftoverCalls, ZeroingInPlaceInsideAWindow) {
  Trainer r(config("SGD"));
  r.engine.backward(r.loss(0));
  r.engine.step();
#if TORCH_VERSION_MAJOR >= 2
  r.engine.optimizer().zero_grad(/*set_to_none=*/false);  // 2.x's default sets to none
#else
  r.engine.optimizer().zero_grad();  // LibTorch 1.13: zeroes in place
#endif
  EXPECT_NE(r.usage_error([&] {
               r.engine.backward(r.loss(1));
             }).find("was changed in place (zeroed or scaled) between two micro-steps"),
            std::string::npos);
}

TEST(LeftoverCalls, ZeroGradAtTheTopOfEveryIterationWithGas1IsHarmless) {
  // The first micro-step of a window finds no gradients: clearing them changes nothing.
  Trainer r(R"({"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})");
  for (int64_t t = 0; t < 3; ++t) {
    r.model->zero_grad();
    r.engine.backward(r.loss(t));
    r.engine.step();
  }
  EXPECT_EQ(r.engine.global_steps(), 3);
}

TEST(LeftoverCalls, ClipGradNormBeforeTheBoundaryStep) {
  Trainer r(config("AdamW"));
  r.engine.backward(r.loss(0));
  r.engine.step();
  r.engine.backward(r.loss(1));
  torch::nn::utils::clip_grad_norm_(r.model->parameters(), 0.001);  // scales through .data()
  EXPECT_EQ(r.usage_error([&] { r.engine.step(); }),
            "the gradient of parameter \"weight\" was scaled through .data() (as "
            "clip_grad_norm_ does) between engine.backward() and engine.step() (at micro_steps "
            "1): remove the call that changes .grad there (clip_grad_norm_, zero_grad() or your "
            "own scaling) from your loop. At the boundary engine.step() averages over the ranks, "
            "unscales and clips to \"gradient_clipping\" itself, in that order. See "
            "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation), "
            "pitfall "
            "5. To do this on purpose set \"stepwise\": {\"check_grads_changed\": false}.");
}

TEST(LeftoverCalls, InPlaceChangeBeforeAnyStep) {
  Trainer r(config("AdamW"));
  r.engine.backward(r.loss(0));
  r.model->bias.mutable_grad().mul_(2.0);  // through the autograd tensor: versions see it
  EXPECT_NE(r.usage_error([&] { r.engine.step(); })
                .find("the gradient of parameter \"bias\" was changed in place (zeroed or "
                      "scaled) between engine.backward() and engine.step() (at micro_steps 0)"),
            std::string::npos);
}

void leftover_optimizer_step(const std::string& optimizer, int64_t window) {
  Trainer r(config(optimizer));
  for (int64_t t = 0; t < 2 * window; ++t) {
    r.engine.backward(r.loss(t));
    r.engine.step();
  }
  r.engine.backward(r.loss(2 * window));
  r.engine.step();
  r.engine.backward(r.loss(2 * window + 1));
  r.engine.optimizer().step();  // the plain loop's line, left behind
  EXPECT_EQ(r.usage_error([&] { r.engine.step(); }),
            c10::str("parameter \"weight\" was updated outside the engine since its last "
                     "optimizer step (found at micro_steps ",
                     2 * window + 1,
                     "): remove your optimizer.step() call (or other update of the weights) "
                     "from your loop. engine.step() steps the optimizer at each accumulation "
                     "boundary, so the weights were updated twice. See "
                     "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient "
                     "accumulation), pitfall 5. To do this on purpose set \"stepwise\": "
                     "{\"check_params_changed\": false}."))
      << optimizer << ", window " << window;
}

TEST(LeftoverCalls, OptimizerStepSeenByVersionCounters) {
  // AdamW updates in place through autograd tensors: the version counters see it.
  leftover_optimizer_step("AdamW", 0);
  leftover_optimizer_step("AdamW", 2);
}

TEST(LeftoverCalls, OptimizerStepOfAVersionBlindOptimizer) {
  // LibTorch 1.13's SGD updates through .data(): only the norms see it, in the
  // first window (before the engine knows) and after.
  leftover_optimizer_step("SGD", 0);
  leftover_optimizer_step("SGD", 2);
}

TEST(LeftoverCalls, EachOptOutTurnsItsCheckOff) {
  Trainer a(config("SGD", R"({"check_grads_cleared": false})"));
  a.engine.backward(a.loss(0));
  a.engine.step();
  a.model->zero_grad();
  a.engine.backward(a.loss(1));  // allowed: only micro-batch 1 reaches the step
  a.engine.step();
  EXPECT_EQ(a.engine.global_steps(), 1);

  Trainer b(config("SGD", R"({"check_grads_changed": false})"));
  b.engine.backward(b.loss(0));
  b.engine.step();
  b.engine.backward(b.loss(1));
  torch::nn::utils::clip_grad_norm_(b.model->parameters(), 0.001);
  b.engine.step();
  EXPECT_EQ(b.engine.global_steps(), 1);

  // An in-place change allowed at step() is not refused again at the next backward().
  Trainer b2(config("SGD", R"({"check_grads_changed": false})"));
  b2.engine.backward(b2.loss(0));
  b2.model->weight.mutable_grad().mul_(0.5);
  b2.engine.step();
  b2.engine.backward(b2.loss(1));
  b2.engine.step();
  EXPECT_EQ(b2.engine.global_steps(), 1);

  Trainer c(config("SGD", R"({"check_params_changed": false})"));
  c.engine.backward(c.loss(0));
  c.engine.step();
  c.engine.backward(c.loss(1));
  c.engine.optimizer().step();
  c.engine.step();
  EXPECT_EQ(c.engine.global_steps(), 1);
}

TEST(LeftoverCalls, ACorrectLoopNeverTripsOne) {
  // Flushes, skipped steps off and on the boundary, a manual boundary and reading
  // the gradients (not changing them) between backward() and step().
  for (const char* optimizer : {"SGD", "AdamW", "Adam"}) {
    Trainer r(config(optimizer));
    for (int64_t t = 0; t < 7; ++t) {
      r.engine.backward(r.loss(t));
      EXPECT_TRUE(r.model->weight.grad().isfinite().all().item<bool>());
      r.engine.step();
    }
    EXPECT_TRUE(r.engine.flush());
    r.engine.set_gradient_accumulation_boundary(false);
    r.engine.backward(r.loss(7));
    r.engine.backward(r.loss(8));
    r.engine.set_gradient_accumulation_boundary(true);
    r.engine.backward(r.loss(9));
    r.engine.step();
    EXPECT_EQ(r.engine.global_steps(), 5) << optimizer;
  }
}

}  // namespace
}  // namespace stepwise
