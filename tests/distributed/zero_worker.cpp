// ZeRO stage 1 against stage 0, on every rank of a W-rank run (tests/distributed/worker.cpp
// calls it for `worker zero`): each case trains the same model on the same data twice, at
// stage 0 and at stage 1, and every number the engine reports must be equal, bit for bit:
// the weights and this rank's fp32 masters after every boundary, the loss scale, skipped
// steps, was_step_applied, the lrs, global_grad_norm() and the counters (NOTE:
// [whole-tensor shards], NOTE: [sharded norm]).
#include <stepwise/stepwise.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/zero_worker.h"
#include "gradient_reducer.h"  // the reducer's call count

namespace {

int extra_failures = 0;  // found inside train()

struct Case {
  std::string precision = "fp32";  // fp32, bf16, fp16
  int64_t gas = 1;
  // plain, flush, manual, tokens, client, groups, fused, sync (overlap_comm false),
  // predivide (gradient_predivide_factor 3: not a power of 2, so it shows in the bits)
  std::string variant = "plain";
};

std::string describe(const Case& c) {
  return c.precision + " GAS " + std::to_string(c.gas) + " " + c.variant;
}

// Six tensors of three sizes, element-wise ops only (LibTorch 1.13 has no Half matmul on
// the CPU): the shards split them between the ranks.
struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(7);
    w1 = register_parameter("weight1", torch::randn({16, 8}) * 0.5);
    b1 = register_parameter("bias1", torch::randn({16, 8}) * 0.1);
    w2 = register_parameter("weight2", torch::randn({16, 8}) * 0.2);
    b2 = register_parameter("bias2", torch::zeros({8}));
    w3 = register_parameter("weight3", torch::ones({8}));
    b3 = register_parameter("bias3", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return ((x * w1 + b1).pow(2) * w2).sum(1) * w3 + b2 + b3;
  }
  torch::Tensor w1, b1, w2, b2, w3, b3;
};

nlohmann::json config_of(const Case& c, int64_t stage) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 4},
      {"gradient_accumulation_steps", c.gas},
      {"gradient_clipping", 0.05},  // below the norms: it clips every step
      {"steps_per_print", 1000000000},
      {"zero_optimization", {{"stage", stage}, {"allgather_bucket_size", 100}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}, {"warmup_max_lr", 0.01}}}}}};
  if (c.variant == "sync") j["zero_optimization"]["overlap_comm"] = false;
  if (c.variant == "predivide") j["gradient_predivide_factor"] = 3.0;
  if (c.variant != "client" && c.variant != "groups") {
    j["optimizer"] = {
        {"type", "AdamW"},
        {"params", {{"lr", 0.01}, {"weight_decay", 0.1}, {"torch_adam", c.variant != "fused"}}}};
  }
  // 2^14: the first steps overflow in half and are skipped, then the scale comes down.
  if (c.precision == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 14}};
  if (c.precision == "bf16") j["bf16"] = {{"enabled", true}};
  return j;
}

// What one boundary reported.
struct Report {
  std::vector<torch::Tensor> weights;  // the model's, as fp32 (exact for half and bf16)
  std::vector<torch::Tensor> masters;  // this rank's fp32 masters
  double loss_scale = 0, grad_norm = 0;
  std::vector<double> lrs;
  bool applied = false;
  int64_t global_steps = 0, micro_steps = 0, skipped = 0, samples = 0;
};

Report report_of(const stepwise::Engine& engine, const torch::nn::Module& model) {
  Report r;
  for (const auto& p : model.parameters()) r.weights.push_back(p.detach().to(torch::kFloat));
  for (const auto& m : engine.master_params()) r.masters.push_back(m.detach().clone());
  r.loss_scale = engine.loss_scale();
  r.grad_norm = engine.global_grad_norm();
  r.lrs = engine.get_lr();
  r.applied = engine.was_step_applied();
  r.global_steps = engine.global_steps();
  r.micro_steps = engine.micro_steps();
  r.skipped = engine.skipped_steps();
  r.samples = engine.global_samples();
  return r;
}

std::vector<Report> train(const Case& c, int64_t stage, int64_t rank, int64_t world) {
  auto model = std::make_shared<Net>();
  stepwise::Engine engine = [&] {
    auto config = stepwise::Config::from_json(config_of(c, stage));
    if (c.variant == "client") {
      auto sgd = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                     torch::optim::SGDOptions(0.01).momentum(0.9));
      return stepwise::initialize(model, config, std::move(sgd));
    }
    if (c.variant == "groups") {
      config.optimizer = stepwise::OptimizerOptions("AdamW").lr(0.01).weight_decay(0.1);
      return stepwise::initialize(model, config, stepwise::weight_decay_groups(*model));
    }
    return stepwise::initialize(model, config);
  }();
  const auto dtype = c.precision == "fp16"   ? torch::kHalf
                     : c.precision == "bf16" ? torch::kBFloat16
                                             : torch::kFloat;
  std::vector<Report> reports;
  const int64_t micro = 6 * c.gas;
  int64_t backwards = 0;
  for (int64_t t = 0; t < micro; ++t, ++backwards) {
    torch::manual_seed(1000 + world * t + rank);
    const auto x = torch::randn({4, 16, 8});
    const auto y = torch::randn({4, 8});
    auto out = model->forward(x.to(dtype)).to(torch::kFloat);
    if (c.variant == "manual") {
      // Windows of 1, 2 and 3 micro-batches, set by hand (GAS only scales the loss).
      const int64_t at = t % 6;
      engine.set_gradient_accumulation_boundary(at == 0 || at == 2 || at == 5);
    }
    if (c.variant == "tokens") {
      // The token-level recipe: sums over the window's 4 * GAS rows, not divided by GAS.
      const double rows = 4.0 * static_cast<double>(c.gas);
      engine.backward((out - y).pow(2).sum(1).sum() / rows,
                      stepwise::BackwardOptions().scale_wrt_gas(false));
    } else {
      auto loss = torch::mse_loss(out, y);
      // An inf on one rank only, once: every rank must skip that step.
      if (c.precision == "fp16" && rank == world - 1 && t == micro - c.gas) {
        loss = loss * std::numeric_limits<float>::infinity();
      }
      engine.backward(loss);
    }
    if (stage == 2 && world > 1) {
      // NOTE: [stage 2 gradients]: no gradient stays on .grad between micro-steps.
      for (const auto& p : model->parameters()) {
        if (p.grad().defined()) {
          std::cout << "FAILED: " << describe(c) << ": a gradient on .grad after backward "
                    << "at stage 2" << std::endl;
          extra_failures += 1;
          break;
        }
      }
    }
    engine.step();
    const bool flushed = c.variant == "flush" && t == micro - 2 && engine.flush();
    if (engine.global_steps() > static_cast<int64_t>(reports.size()))
      reports.push_back(report_of(engine, *model));
    if (flushed) {  // the last window ended early, with 1 of its GAS micro-batches
      backwards += 1;
      break;
    }
  }
  if (stage == 2 && world == 2) {
    // Two owners' buckets (the default bucket holds a rank's whole share), one reduce each
    // per micro-step.
    const int64_t calls = engine.gradient_reducer().all_reduce_calls();
    if (calls != 2 * backwards) {
      std::cout << "FAILED: " << describe(c) << ": " << calls << " reduces in " << backwards
                << " backward() calls" << std::endl;
      extra_failures += 1;
    }
  }
  if (stage >= 1 && world > 1) {
    // This rank keeps and steps its share only.
    const size_t all = model->parameters().size();
    if (engine.master_params().size() >= all) {
      std::cout << "FAILED: " << describe(c) << ": rank " << rank << " keeps "
                << engine.master_params().size() << " of " << all << " masters" << std::endl;
      extra_failures += 1;
    }
  }
  return reports;
}

// NOTE: [ZeRO resume test] Stage 1 saves at micro-step `at` (7: inside a window of GAS 2;
// 8: at a boundary; fp16's first steps overflow, so some steps were applied by then: the
// masters are no longer the rounded weights), a fresh engine over a model with other
// weights loads it and trains on; it must end as the uninterrupted run, bit for bit.
struct Run {
  std::shared_ptr<Net> model;
  stepwise::Engine engine;
};

Run start(const std::string& precision, int64_t stage) {
  auto model = std::make_shared<Net>();
  Case c{precision, 2, "plain"};
  auto engine = stepwise::initialize(model, stepwise::Config::from_json(config_of(c, stage)));
  return {model, std::move(engine)};
}

// The same weights, loss scale, counters and lrs, and this rank's masters (a stage-1 run
// keeps some of a stage-0 run's, in order), bit for bit.
bool same_run(const Report& got, const Report& want) {
  bool same = got.weights.size() == want.weights.size() && got.loss_scale == want.loss_scale &&
              got.global_steps == want.global_steps && got.skipped == want.skipped &&
              got.lrs == want.lrs;
  for (size_t i = 0; same && i < want.weights.size(); ++i) {
    same = torch::equal(got.weights[i], want.weights[i]);
  }
  const auto& few = got.masters.size() <= want.masters.size() ? got.masters : want.masters;
  const auto& all = got.masters.size() <= want.masters.size() ? want.masters : got.masters;
  size_t k = 0;
  for (size_t i = 0; i < all.size() && k < few.size(); ++i) {
    if (all[i].sizes() == few[k].sizes() && torch::equal(all[i], few[k])) k += 1;
  }
  return same && k == few.size() && !few.empty();
}

void micro_step(Run& run, const std::string& precision, int64_t t, int64_t rank, int64_t world) {
  torch::manual_seed(1000 + world * t + rank);
  const auto x = torch::randn({4, 16, 8});
  const auto y = torch::randn({4, 8});
  const auto dtype = precision == "fp16" ? torch::kHalf : torch::kFloat;
  run.engine.backward(torch::mse_loss(run.model->forward(x.to(dtype)).to(torch::kFloat), y));
  run.engine.step();
}

// Trains from micro-step `from` to the end (12) and reports.
Report finish(Run& run, const std::string& precision, int64_t from, int64_t rank, int64_t world) {
  for (int64_t t = from; t < 12; ++t) micro_step(run, precision, t, rank, world);
  return report_of(run.engine, *run.model);
}

}  // namespace

int run_zero_checkpoint(const std::string& dir, int64_t rank, int64_t world) {
  int failures = 0;
  const auto fail = [&](const std::string& what) {
    std::cout << "FAILED: " << what << std::endl;
    failures += 1;
  };
  for (const std::string precision : {"fp32", "fp16"}) {
    Report want;  // stage 1's uninterrupted run
    for (const int64_t stage : {1, 2}) {
      Run ref = start(precision, stage);
      for (int64_t t = 0; t < 12; ++t) micro_step(ref, precision, t, rank, world);
      const Report uninterrupted = report_of(ref.engine, *ref.model);
      if (stage == 1) want = uninterrupted;
      for (int64_t at : {7, 8}) {
        const std::string tag =
            precision + (stage == 2 ? "_stage2" : "") + "_at" + std::to_string(at);
        {
          Run first = start(precision, stage);
          for (int64_t t = 0; t < at; ++t) micro_step(first, precision, t, rank, world);
          if (first.engine.skipped_steps() == first.engine.global_steps()) {
            fail(tag + ": no step was applied before the save");
          }
          first.engine.save_checkpoint(dir, stepwise::SaveOptions().tag(tag));
          // The save leaves the window as it was: the run goes on as if it had not saved.
          if (!same_run(finish(first, precision, at, rank, world), uninterrupted)) {
            fail(tag + ": the run that saved differs from the uninterrupted one");
          }
        }
        Run second = start(precision, stage);
        {
          torch::NoGradGuard no_grad;
          for (auto& p : second.model->parameters()) p.fill_(0.3);  // not the saved weights
        }
        second.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(tag));
        for (int64_t t = at; t < 12; ++t) micro_step(second, precision, t, rank, world);
        const Report got = report_of(second.engine, *second.model);
        if (!same_run(got, uninterrupted)) {
          fail(tag + ": the resumed run differs from the uninterrupted one");
        }
        const std::string mine = dir + "/" + tag + "/zero_pp_rank_" + std::to_string(rank) +
                                 "_mp_rank_00_optim_states.pt";
        if (!std::ifstream(mine).good()) fail(tag + ": no " + mine);
        if (std::ifstream(dir + "/" + tag + "/optimizer_states.pt").good()) {
          fail(tag + ": a sharded save wrote the unsharded optimizer file");
        }
      }
    }
    // NOTE: [stage 2 gradients]: a stage-2 window's gradients are sums over the ranks, so
    // another stage does not continue it (at a boundary it may: the state is stage 1's).
    try {
      Run one = start(precision, 1);
      one.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_stage2_at7"));
      fail(precision + ": stage 2's window was continued at stage 1");
    } catch (const stepwise::CheckpointError& e) {
      if (std::string(e.what()).find("with ZeRO stage 2 (now 1)") == std::string::npos) {
        fail(precision + ": stage 2's window at stage 1: " + e.what());
      }
    }
    {
      Run one = start(precision, 1);
      one.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_stage2_at8"));
      if (one.engine.global_steps() != 4) fail(precision + ": stage 2 -> 1 at a boundary");
    }
    // NOTE: [resharding]: stage 1 -> stage 0 and stage 0 -> stage 1 at a boundary; stage 0
    // is stage 1 to the bit, so each run ends as the uninterrupted one.
    Run zero = start(precision, 0);
    zero.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_at8"));
    if (!same_run(finish(zero, precision, 8, rank, world), want)) {
      fail(precision + ": stage 1's checkpoint resumed at stage 0 differs");
    }
    {
      Run first = start(precision, 0);
      for (int64_t t = 0; t < 8; ++t) micro_step(first, precision, t, rank, world);
      first.engine.save_checkpoint(dir, stepwise::SaveOptions().tag(precision + "_stage0"));
    }
    Run one = start(precision, 1);
    one.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_stage0"));
    if (!same_run(finish(one, precision, 8, rank, world), want)) {
      fail(precision + ": stage 0's checkpoint resumed at stage 1 differs");
    }
  }
  std::cout << "rank " << rank << ": ZeRO stages 1 and 2 resumed bit for bit from 8 checkpoints, "
            << "resharded to stage 0 and back from 4, " << failures << " failures" << std::endl;
  return failures;
}

// NOTE: [resharding] across world sizes: `worker zero-reshard DIR` with W = 1 loads each
// "<precision>_at8" (two ranks, stage 1) and saves it as "<precision>_w1" (one rank, so
// unsharded); with W = 2 it loads "<precision>_w1" at stage 1 and must end as the
// uninterrupted two-rank run: every master and optimizer state went through one process.
int run_zero_reshard(const std::string& dir, int64_t rank, int64_t world) {
  int failures = 0;
  for (const std::string precision : {"fp32", "fp16"}) {
    if (world == 1) {
      Run alone = start(precision, 1);
      alone.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_at8"));
      if (alone.engine.optimizer().state().size() != 6) {
        std::cout << "FAILED: " << precision << ": " << alone.engine.optimizer().state().size()
                  << " of 6 parameters have an optimizer state after the load" << std::endl;
        failures += 1;
      }
      alone.engine.save_checkpoint(dir, stepwise::SaveOptions().tag(precision + "_w1"));
      continue;
    }
    Run ref = start(precision, 1);
    const Report want = finish(ref, precision, 0, rank, world);
    Run back = start(precision, 1);
    back.engine.load_checkpoint(dir, stepwise::LoadOptions().tag(precision + "_w1"));
    if (!same_run(finish(back, precision, 8, rank, world), want)) {
      std::cout << "FAILED: " << precision << ": W = 2 -> 1 -> 2 differs" << std::endl;
      failures += 1;
    }
  }
  std::cout << "rank " << rank << " of " << world << ": resharded across world sizes, " << failures
            << " failures" << std::endl;
  return failures;
}

namespace {

// How `other` differs from stage 0's run, "" if it does not: bit for bit when `tolerance`
// is 0; else the weights and the grad norm within `tolerance` (relative to the largest
// weight, and to the norm) and every other number equal.
std::string difference(const std::vector<Report>& zero, const std::vector<Report>& other,
                       double tolerance, double& worst) {
  std::ostringstream bad;
  if (zero.size() != other.size() || zero.empty()) {
    bad << zero.size() << " vs " << other.size() << " boundaries";
  }
  for (size_t s = 0; s < zero.size() && s < other.size() && bad.str().empty(); ++s) {
    const auto& a = zero[s];
    const auto& b = other[s];
    std::ostringstream at;
    at << " at boundary " << s + 1 << "; ";
    if (a.loss_scale != b.loss_scale)
      bad << "loss scale " << a.loss_scale << " vs " << b.loss_scale << at.str();
    const bool nans = std::isnan(a.grad_norm) && std::isnan(b.grad_norm);
    if (!nans && std::abs(a.grad_norm - b.grad_norm) > tolerance * std::abs(a.grad_norm))
      bad << "grad norm " << a.grad_norm << " vs " << b.grad_norm << at.str();
    if (a.lrs != b.lrs) bad << "lrs" << at.str();
    if (a.applied != b.applied || a.skipped != b.skipped) bad << "skipped steps" << at.str();
    if (a.global_steps != b.global_steps || a.micro_steps != b.micro_steps ||
        a.samples != b.samples)
      bad << "counters" << at.str();
    for (size_t i = 0; i < a.weights.size(); ++i) {
      const double scale = a.weights[i].abs().max().item<double>();
      const double diff = (a.weights[i] - b.weights[i]).abs().max().item<double>();
      worst = std::max(worst, diff / std::max(scale, 1e-30));
      const bool fits =
          tolerance == 0 ? torch::equal(a.weights[i], b.weights[i]) : diff <= tolerance * scale;
      if (!fits) {
        bad << "weight " << i << " differs by " << diff << at.str();
        break;
      }
    }
    if (tolerance == 0) {
      // The sharded run's masters are stage 0's at the indices this rank owns, in order.
      size_t k = 0;
      for (size_t i = 0; i < a.masters.size() && k < b.masters.size(); ++i) {
        if (a.masters[i].sizes() == b.masters[k].sizes() &&
            torch::equal(a.masters[i], b.masters[k]))
          k += 1;
      }
      if (k != b.masters.size()) bad << "this rank's masters are not stage 0's" << at.str();
    }
  }
  return bad.str();
}

}  // namespace

int run_zero_matrix(int64_t rank, int64_t world) {
  std::vector<Case> cases;
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    for (int64_t gas : {1, 2, 4}) cases.push_back({precision, gas, "plain"});
  }
  for (const char* variant : {"flush", "manual", "tokens", "client", "groups", "fused", "sync"}) {
    cases.push_back({"fp32", 2, variant});
  }
  cases.push_back({"bf16", 2, "client"});
  cases.push_back({"fp16", 2, "fused"});
  cases.push_back({"fp32", 1, "predivide"});
  int failures = 0, one_failures = 0;
  int64_t boundaries = 0, skipped = 0, fp16_applied = 0;
  int exact_two = 0, close_two = 0;
  double worst_fp32 = 0, worst_half = 0;  // the largest weight difference, of the weight
  for (const auto& c : cases) {
    const auto zero = train(c, 0, rank, world);
    double ignored = 0;
    const std::string one = difference(zero, train(c, 1, rank, world), 0.0, ignored);
    if (!one.empty()) {
      std::cout << "FAILED: stage 1, " << describe(c) << ": " << one << std::endl;
      one_failures += 1;
    }
    // NOTE: [stage 2 gradients]: one micro-step per window sums the same two numbers as
    // stage 0, bit for bit; more add in another order, within the rounding of the sums
    // (fp32: 1e-5 of the largest weight after 6 clipped AdamW steps; bf16 and fp16 round
    // every weight to 8 or 11 bits, so a rounding apart is 2^-7 of it).
    const bool exact = c.gas == 1;
    const double tolerance = exact ? 0.0 : c.precision == "fp32" ? 1e-5 : 1.0 / 128;
    const std::string two = difference(zero, train(c, 2, rank, world), tolerance,
                                       exact                   ? ignored
                                       : c.precision == "fp32" ? worst_fp32
                                                               : worst_half);
    if (!two.empty()) {
      std::cout << "FAILED: stage 2, " << describe(c) << ": " << two << std::endl;
      failures += 1;
    } else {
      (exact ? exact_two : close_two) += 1;
    }
    for (const auto& b : zero) {
      boundaries += 1;
      skipped += b.applied ? 0 : 1;
      fp16_applied += b.applied && c.precision == "fp16" ? 1 : 0;
    }
  }
  std::cout << "rank " << rank << ": stage 1 equals stage 0 bit for bit in "
            << cases.size() - one_failures << " of " << cases.size() << " cases (" << boundaries
            << " boundaries; in fp16, " << skipped << " skipped for overflow and " << fp16_applied
            << " applied)" << std::endl;
  std::cout << "rank " << rank << ": stage 2 equals stage 0 bit for bit in " << exact_two
            << " cases of one micro-step per window, and within tolerance in " << close_two
            << " (largest weight difference: fp32 " << std::setprecision(1) << worst_fp32
            << ", bf16 and fp16 " << worst_half << " of the weight)" << std::endl;
  return failures + one_failures + extra_failures;
}
