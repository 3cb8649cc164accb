// Accumulation windows: the window's loss, windows ended early (flush, a boundary set
// by hand), windows whose loss the loop normalises itself, and total_num_steps.
#include <stepwise/engine.h>

#include <gtest/gtest.h>

#include "support/error_of.h"
#include "support/reference_problem.h"

namespace stepwise {
namespace {

using testing::reference_linear;
using testing::reference_samples;

std::string config_json(int64_t gas, const std::string& extra = "") {
  return c10::str(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )", gas,
                  R"(, "gradient_clipping": 0.5, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.05}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.05,
                    "warmup_num_steps": 3, "warmup_type": "linear"}})",
                  extra, "}");
}

struct WindowTrainer {
  torch::nn::Linear model = reference_linear();
  Engine engine;
  explicit WindowTrainer(int64_t gas, const std::string& extra = "")
      : engine(initialize(model, Config::from_string(config_json(gas, extra)))) {}
  torch::Tensor loss(int64_t t) {
    auto [x, y] = reference_samples(2 * t, 2);
    return torch::mse_loss(model->forward(x), y);
  }
};

// Bit for bit when the rescale is a power of two, else to float rounding.
void expect_same_weights(WindowTrainer& a, WindowTrainer& b, double atol = 0.0) {
  EXPECT_TRUE(torch::allclose(a.model->weight, b.model->weight, 0.0, atol))
      << a.model->weight << b.model->weight;
  EXPECT_TRUE(torch::allclose(a.model->bias, b.model->bias, 0.0, atol));
}

TEST(Windows, WindowLossIsTheMeanOfTheWindowsLosses) {
  WindowTrainer r(4);
  EXPECT_EQ(testing::error_of<UsageError>([&] { r.engine.window_loss(); }),
            "engine.window_loss() was called before the first accumulation window ended: read "
            "it after a step() at the boundary (is_gradient_accumulation_boundary() before that "
            "step(), or global_steps() > 0) or after flush()");
  double last = 0.0;
  for (int64_t window = 0; window < 2; ++window) {
    double sum = 0.0;
    for (int64_t t = 4 * window; t < 4 * window + 4; ++t) {
      auto loss = r.loss(t);
      sum += loss.item<double>();
      r.engine.backward(loss);
      r.engine.step();
    }
    last = sum / 4;
    EXPECT_NEAR(r.engine.window_loss().item<double>(), last, 1e-6 * last);
    EXPECT_EQ(r.engine.window_loss().dim(), 0);
    EXPECT_FALSE(r.engine.window_loss().requires_grad());
  }
  // A flushed window of k = 3: the mean over the 3 micro-batches it had.
  double sum = 0.0;
  for (int64_t t = 8; t < 11; ++t) {
    auto loss = r.loss(t);
    sum += loss.item<double>();
    r.engine.backward(loss);
    r.engine.step();
  }
  EXPECT_NEAR(r.engine.window_loss().item<double>(), last, 1e-6 * last) << "still the last window";
  EXPECT_TRUE(r.engine.flush());
  EXPECT_NEAR(r.engine.window_loss().item<double>(), sum / 3, 1e-6 * sum);
}

TEST(Windows, TheSumOfBackwardsReturnsIsTheWindowMean) {
  // The guide's claim: over a whole window, the values backward() returns add up to
  // the mean loss of the window, which is window_loss().
  WindowTrainer r(4);
  torch::Tensor returned_sum = torch::zeros({});
  double mean = 0.0;
  for (int64_t t = 0; t < 4; ++t) {
    auto loss = r.loss(t);
    mean += loss.item<double>() / 4;
    returned_sum += r.engine.backward(loss);
    r.engine.step();
  }
  EXPECT_NEAR(returned_sum.item<double>(), mean, 1e-6);
  EXPECT_NEAR(r.engine.window_loss().item<double>(), mean, 1e-6);
}

TEST(Windows, ABoundarySetByHandEndsTheWindowLikeAGasKEngine) {
  // GAS 4, but the trainer decides: 3 backward() calls, then one step().
  WindowTrainer manual(4), counting(3);
  manual.engine.set_gradient_accumulation_boundary(false);
  for (int64_t t = 0; t < 3; ++t) {
    if (t == 2) manual.engine.set_gradient_accumulation_boundary(true);
    EXPECT_NEAR(manual.engine.backward(manual.loss(t)).item<double>(),
                manual.loss(t).item<double>() / 4, 1e-7)
        << "backward() still returns loss / GAS (fact 1)";
    counting.engine.backward(counting.loss(t));
    counting.engine.step();
  }
  EXPECT_TRUE(manual.engine.is_gradient_accumulation_boundary());
  manual.engine.step();
  expect_same_weights(manual, counting, 1e-7);  // 4/3 rounds
  EXPECT_EQ(manual.engine.global_steps(), 1);
  EXPECT_EQ(manual.engine.global_samples(), 6);
  EXPECT_EQ(manual.engine.micro_steps(), 4) << "moved to the end of the window";
  EXPECT_DOUBLE_EQ(manual.engine.get_lr()[0], counting.engine.get_lr()[0]);
  EXPECT_NEAR(manual.engine.window_loss().item<double>(),
              counting.engine.window_loss().item<double>(), 1e-7);

  // Sticky: still a boundary, so the next step() ends a window of 1.
  EXPECT_TRUE(manual.engine.is_gradient_accumulation_boundary());
  manual.engine.backward(manual.loss(3));
  manual.engine.step();
  EXPECT_EQ(manual.engine.global_steps(), 2);
  EXPECT_EQ(manual.engine.micro_steps(), 8);

  // Cleared: counting again, in whole windows of GAS.
  manual.engine.clear_gradient_accumulation_boundary();
  for (int64_t t = 4; t < 8; ++t) {
    EXPECT_EQ(manual.engine.is_gradient_accumulation_boundary(), t == 7);
    manual.engine.backward(manual.loss(t));
    manual.engine.step();
  }
  EXPECT_EQ(manual.engine.global_steps(), 3);
  EXPECT_EQ(manual.engine.micro_steps(), 12);
}

TEST(Windows, TheBoundaryIsClearedOnlyBetweenWindows) {
  WindowTrainer r(4);
  r.engine.set_gradient_accumulation_boundary(false);
  r.engine.backward(r.loss(0));
  r.engine.backward(r.loss(1));
  EXPECT_EQ(testing::error_of<UsageError>([&] { r.engine.clear_gradient_accumulation_boundary(); }),
            "engine.clear_gradient_accumulation_boundary() was called inside a window (2 "
            "backward() calls pending): counting would end that window as if it had GAS "
            "micro-batches. End it first (a step() with the boundary set to true, or flush()), "
            "then clear it");
  r.engine.set_gradient_accumulation_boundary(true);
  r.engine.step();
  r.engine.clear_gradient_accumulation_boundary();
  EXPECT_EQ(r.engine.micro_steps(), 4);
}

TEST(Windows, ABoundarySetByHandAfterGasBackwardsEqualsCounting) {
  WindowTrainer manual(4), counting(4);
  manual.engine.set_gradient_accumulation_boundary(false);
  for (int64_t t = 0; t < 4; ++t) {
    if (t == 3) manual.engine.set_gradient_accumulation_boundary(true);
    manual.engine.backward(manual.loss(t));
    counting.engine.backward(counting.loss(t));
    counting.engine.step();
  }
  manual.engine.step();
  expect_same_weights(manual, counting);
  EXPECT_EQ(manual.engine.global_samples(), counting.engine.global_samples());
}

TEST(Windows, AWindowTheLoopNormalisesItselfIsNotRescaledByFlush) {
  // Token-level style: scale_wrt_gas off and each loss divided by the window's own
  // sample count. A flushed window of 2 must then equal a GAS 2 engine's window.
  WindowTrainer token(4, R"(, "stepwise": {"scale_wrt_gas": false})"), gas2(2);
  for (int64_t t = 0; t < 2; ++t) {
    token.engine.backward(token.loss(t) / 2.0);
    token.engine.step();
    gas2.engine.backward(gas2.loss(t));
    gas2.engine.step();
  }
  EXPECT_TRUE(token.engine.flush());
  expect_same_weights(token, gas2);
  EXPECT_NEAR(token.engine.window_loss().item<double>(), gas2.engine.window_loss().item<double>(),
              1e-7);
}

TEST(Windows, AWindowMixingScaledAndUnscaledLossesCannotEndEarly) {
  WindowTrainer r(4);
  r.engine.backward(r.loss(0));
  r.engine.step();
  r.engine.backward(r.loss(1), BackwardOptions().scale_wrt_gas(false));
  r.engine.step();
  EXPECT_EQ(testing::error_of<UsageError>([&] { r.engine.flush(); }),
            "this accumulation window mixed backward() calls that divided the loss by GAS (1) "
            "with calls that did not (1), so its gradients have no common scale to correct: use "
            "one BackwardOptions().scale_wrt_gas(...) value for a whole window");
}

TEST(Windows, TotalNumSteps) {
  // Two epochs of 14 micro-batches, GAS 4: 4 steps an epoch with a flush (4+4+4+2),
  // 7 without (28 / 4: the remainder of epoch 1 completes a window in epoch 2).
  EXPECT_EQ(total_num_steps(14, 2, 4, EpochEnd::kFlush), 8);
  EXPECT_EQ(total_num_steps(14, 2, 4, EpochEnd::kCarry), 7);
  EXPECT_EQ(total_num_steps(16, 3, 4, EpochEnd::kFlush), 12);
  EXPECT_EQ(total_num_steps(16, 3, 4, EpochEnd::kCarry), 12);
  EXPECT_EQ(testing::error_of<UsageError>([] { total_num_steps(14, 0, 4, EpochEnd::kFlush); }),
            "total_num_steps(micro_batches_per_epoch=14, epochs=0, gas=4): each must be positive");

  // And what an engine really does, epoch by epoch.
  for (EpochEnd end : {EpochEnd::kFlush, EpochEnd::kCarry}) {
    WindowTrainer r(4);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      for (int64_t t = 0; t < 14; ++t) {
        r.engine.backward(r.loss(t));
        r.engine.step();
      }
      if (end == EpochEnd::kFlush) r.engine.flush();
    }
    EXPECT_EQ(r.engine.global_steps(), total_num_steps(14, 2, 4, end));
  }
}

}  // namespace
}  // namespace stepwise
