// The guard rails: each fires with its message; strict_cadence off turns cadence off.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::reference_linear;
using testing::reference_samples;

const char* kConfig = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "steps_per_print": 1000,
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})";

struct Fixture {
  torch::nn::Linear model = reference_linear();
  Engine engine;
  explicit Fixture(const std::string& extra = "")
      : engine(initialize(
            model, Config::from_string(extra.empty() ? std::string(kConfig)
                                                     : std::string(kConfig).insert(1, extra)))) {}
  torch::Tensor loss(int64_t t = 0) {
    auto [x, y] = reference_samples(2 * t, 2);
    return torch::mse_loss(model->forward(x), y);
  }
};

template <typename F>
std::string usage_error(F&& f) {
  return testing::error_of<UsageError>(std::forward<F>(f));
}

TEST(GuardRails, BackwardTwiceWithoutStep) {
  Fixture f;
  f.engine.backward(f.loss());
  EXPECT_EQ(usage_error([&] { f.engine.backward(f.loss(1)); }),
            "engine.backward() was called twice without engine.step() in between (at "
            "micro_steps 0): call engine.step() after every engine.backward(), also between "
            "accumulation boundaries. The engine counts micro-batches in step(); see "
            "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation), "
            "pitfall 4. "
            "To allow this anyway set \"stepwise\": {\"strict_cadence\": false}.");
}

TEST(GuardRails, StepWithoutBackward) {
  Fixture f;
  EXPECT_EQ(usage_error([&] { f.engine.step(); }),
            "engine.step() was called without a preceding engine.backward() (at micro_steps "
            "0): call engine.backward(loss) once per micro-batch, then engine.step(). See "
            "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation). "
            "To allow "
            "this anyway set \"stepwise\": {\"strict_cadence\": false}.");
}

TEST(GuardRails, FlushRightAfterBackward) {
  Fixture f;
  f.engine.backward(f.loss());
  EXPECT_EQ(
      usage_error([&] { f.engine.flush(); }),
      "engine.flush() was called right after engine.backward(): call engine.step() "
      "first (after every backward()), then flush() at the end of the epoch. See "
      "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation).");
}

// The error of the step() after a loop steps the engine's scheduler itself, as a plain
// LibTorch loop's leftover scheduler.step() does.
std::string error_after_stepping_its_scheduler(Fixture& f) {
  for (int64_t t = 0; t < 2; ++t) {
    f.engine.backward(f.loss(t));
    f.engine.step();
  }
  f.engine.lr_scheduler()->step();
  f.engine.backward(f.loss(2));
  return usage_error([&] { f.engine.step(); });
}

TEST(GuardRails, UserSteppingTheEnginesScheduler) {
  Fixture f;
  EXPECT_EQ(error_after_stepping_its_scheduler(f),
            "the LR scheduler owned by the engine was stepped outside it: it has taken 2 steps, "
            "the engine stepped it 1 time. Remove your scheduler.step() call: engine.step() "
            "steps the scheduler at each accumulation boundary (not on skipped steps). See "
            "docs/gradient-accumulation.md (stepwise docs: The pitfalls of gradient accumulation), "
            "pitfall 3.");
}

TEST(GuardRails, StrictCadenceOffKeepsTheSchedulerCheck) {
  Fixture f(R"("stepwise": {"strict_cadence": false}, )");
  EXPECT_NE(error_after_stepping_its_scheduler(f).find(
                "the LR scheduler owned by the engine was stepped outside it"),
            std::string::npos);
}

TEST(GuardRails, UserSteppingAClientScheduler) {
  auto model = reference_linear();
  auto optimizer =
      std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  auto scheduler = std::make_unique<torch::optim::StepLR>(*optimizer, 5);
  scheduler->step();  // steps before initialize are fine: counting starts there
  auto* raw = scheduler.get();
  auto engine = initialize(model, Config::from_string(R"({"train_batch_size": 2})"),
                           std::move(optimizer), std::move(scheduler));
  raw->step();
  auto [x, y] = reference_samples(0, 2);
  engine.backward(torch::mse_loss(model->forward(x), y));
  EXPECT_NE(usage_error([&] { engine.step(); })
                .find("it has taken 1 step, the engine stepped "
                      "it 0 times. Remove your scheduler.step()"),
            std::string::npos);
}

TEST(GuardRails, BadLossValues) {
  Fixture f;
  const auto samples = reference_samples(0, 2);  // a pair: C++17 lambdas capture no bindings
  const std::string prefix =
      "engine.backward(loss) needs a defined, floating-point, 0-dim loss that requires grad "
      "(the mean over the micro-batch), got ";
  EXPECT_EQ(usage_error([&] { f.engine.backward(torch::Tensor()); }),
            prefix + "an undefined tensor");
  EXPECT_EQ(usage_error([&] {
              f.engine.backward(torch::mse_loss(f.model->forward(samples.first), samples.second,
                                                torch::Reduction::None));
            }),
            prefix +
                "a Float tensor of shape [2, 1] that requires grad; reduce it first, e.g. "
                "loss.mean()");
  EXPECT_EQ(usage_error([&] { f.engine.backward(torch::tensor(1.5)); }),
            prefix + "a Float tensor of shape [] that does not require grad");
  EXPECT_EQ(usage_error([&] { f.engine.backward(torch::tensor(3)); }),
            prefix + "a Long tensor of shape [] that does not require grad");
  // A rejected loss does not count as a backward(): the loop can go on.
  f.engine.backward(f.loss());
  f.engine.step();
}

TEST(GuardRails, StrictCadenceOffAllowsBoth) {
  Fixture f(R"("stepwise": {"strict_cadence": false}, )");
  f.engine.backward(f.loss(0));
  f.engine.backward(f.loss(1));  // gradients of both accumulate
  f.engine.step();
  f.engine.step();  // the boundary: counted by step() calls only
  EXPECT_EQ(f.engine.global_steps(), 1);
  EXPECT_EQ(f.engine.micro_steps(), 2);
}

TEST(GuardRails, WithoutStrictCadenceSkippingStepMiscountsLikeDeepSpeed) {
  // Pitfall 4 demonstrated: step() only every second micro-batch with GAS 2 makes
  // the optimizer step every FOURTH micro-batch.
  Fixture f(R"("stepwise": {"strict_cadence": false}, )");
  for (int64_t t = 0; t < 8; ++t) {
    f.engine.backward(f.loss(t));
    if ((t + 1) % 2 == 0) f.engine.step();
  }
  EXPECT_EQ(f.engine.global_steps(), 2) << "8 micro-batches, GAS 2, but only 2 optimizer steps";
}

}  // namespace
}  // namespace stepwise
