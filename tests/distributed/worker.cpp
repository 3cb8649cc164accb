// One rank of the data-parallel tests (tests/distributed/distributed_test.cpp
// starts W of these with torchrun's variables). Exit 0 when every check of the
// mode passed; failures are printed, one per line.
//
//   worker trace FILE [cpu|cuda [STAGE]] the DeepSpeed trace, per micro-step, this rank (at
//                                        ZeRO STAGE, 0 by default)
//                                        (cuda: the model on cuda:LOCAL_RANK, over NCCL)
//   worker train MBS GAS STEPS BUCKET OUT [cuda]  trains; checks all-reduce counts and the
//                                        backend; writes weights
//   worker kill                          rank 1 dies at micro-step 3; rank 0 must fail
//   worker mismatch-gas | mismatch-shape  the ranks disagree; initialize must throw
//   worker broadcast-fp16                rank 1 starts elsewhere, fp16: its masters are rank 0's
//   worker checkpoint DIR                saves at every micro-step of a window and resumes
//                                        in fresh engines: bitwise the uninterrupted run;
//                                        then tag validation and errors on one rank
//   worker overflow                      fp16: an inf on rank 1 only skips the step on both
//   worker kill-save DIR                 saves "before", then rank 1 dies inside the save
//                                        of "after"; rank 0 must fail, "before" stays
//   worker zero                          ZeRO stage 1 equals stage 0 bit for bit over a matrix
//                                        of cases (tests/distributed/zero_worker.cpp)
//   worker zero-checkpoint DIR           stage 1 saves and resumes bit for bit, also at stage 0
//                                        and from a stage-0 checkpoint
//   worker zero-reshard DIR              W = 1: loads those and saves them unsharded; W = 2:
//                                        resumes those bit for bit
#include <stepwise/stepwise.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "distributed/token_problem.h"
#include "distributed/zero_worker.h"
#include "gradient_reducer.h"  // internal: the reducer's counters
#include "support/reference_problem.h"

namespace {

using stepwise::testing::reference_linear;
using stepwise::testing::reference_samples;
using stepwise::testing::reference_start;

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cout << "FAILED: " << what << std::endl;
    failures += 1;
  }
}

void check_rel(double actual, double expected, double rel, const std::string& what) {
  const double tolerance = rel * std::max(1.0, std::fabs(expected));
  check(std::fabs(actual - expected) <= tolerance,
        what + ": " + std::to_string(actual) + " vs " + std::to_string(expected));
}

stepwise::Config config_for(int64_t mbs, int64_t gas, int64_t bucket) {
  nlohmann::json json = {{"train_micro_batch_size_per_gpu", mbs},
                         {"gradient_accumulation_steps", gas},
                         {"gradient_clipping", 0.5},
                         {"steps_per_print", 1000000000},
                         {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}},
                         {"stepwise", {{"reduce_bucket_size", bucket}}}};
  // The test sets it to compare the all-reduces started during backward with and without.
  if (const char* overlap = std::getenv("STEPWISE_WORKER_OVERLAP_COMM")) {
    json["stepwise"]["overlap_comm"] = std::string(overlap) == "1";
  }
  // The test sets it to compare DeepSpeed's ways of dividing by W (NOTE: [predivide]).
  if (const char* predivide = std::getenv("STEPWISE_WORKER_PREDIVIDE")) {
    if (std::string(predivide) == "prescale") {
      json["prescale_gradients"] = true;
    } else {
      json["gradient_predivide_factor"] = std::stod(predivide);
    }
  }
  return stepwise::Config::from_json(json);
}

// The device of `where` ("cuda": this rank's GPU), and the backend initialize must choose.
torch::Device device_of(const std::string& where) {
  const char* local = std::getenv("LOCAL_RANK");
  return where == "cuda" ? torch::Device(torch::kCUDA, local ? std::atoi(local) : 0)
                         : torch::Device(torch::kCPU);
}

void check_backend(const torch::Device& device) {
  const auto ctx = stepwise::distributed::default_context();
  const std::string expected = device.is_cuda() ? "nccl" : "gloo";
  check(ctx && ctx->backend_name() == expected,
        "initialize chose backend " + (ctx ? ctx->backend_name() : std::string("none")) +
            " for parameters on " + device.str() + ", expected " + expected);
}

int run_trace(const std::string& file, const torch::Device& device, int64_t zero_stage) {
  auto model = reference_linear();
  model->to(device);
  const int64_t world = stepwise::distributed::world_size_for_engine(device);
  const int64_t rank = stepwise::distributed::rank();
  const auto trace = stepwise::testing::read_trace(file, rank);
  check(trace.setup["world_size"] == world, "world size of the trace");
  check_backend(device);
  if (rank == 1) {
    // Rank 1 starts elsewhere: initialize must broadcast rank 0's parameters.
    torch::NoGradGuard no_grad;
    model->weight.fill_(7.0);
  }
  // The trace's config, at ZeRO `zero_stage`: sharding must change none of its numbers
  // beyond the trace's tolerances (docs/zero.md).
  auto config = trace.setup["config"];
  if (zero_stage > 0) config["zero_optimization"] = {{"stage", zero_stage}};
  auto engine = stepwise::initialize(model, stepwise::Config::from_json(config));
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t mbs = engine.train_micro_batch_size_per_gpu();
  check(engine.train_batch_size() == trace.setup["train_batch_size"], "train_batch_size");
  for (const auto& rec : trace.micro) {
    const int64_t t = rec["micro_step"];
    const std::string at = "rank " + std::to_string(rank) + " micro_step " + std::to_string(t);
    const int64_t first = reference_start(t, gas, mbs, world, rank);
    check(first == rec["sample_indices"][0], at + " first sample");
    auto [x, y] = reference_samples(first, mbs);
    auto loss = torch::mse_loss(model->forward(x.to(device)), y.to(device));
    check_rel(loss.item<double>(), rec["forward_loss"], 1e-5, at + " forward_loss");
    check(engine.is_gradient_accumulation_boundary() == rec["is_gas_boundary"], at + " boundary");
    auto returned = engine.backward(loss);
    check_rel(returned.item<double>(), rec["backward_return"], 1e-5, at + " backward_return");
    engine.step();
    check(engine.was_step_applied() == rec["was_step_applied"], at + " was_step_applied");
    check(engine.global_steps() == rec["global_steps"], at + " global_steps");
    check(engine.global_samples() == rec["global_samples"], at + " global_samples");
    check(engine.micro_steps() == rec["micro_steps"], at + " micro_steps");
    if (!rec["grad_norm_pre_clip"].is_null()) {
      check_rel(engine.global_grad_norm(), rec["grad_norm_pre_clip"], 1e-5, at + " grad norm");
    }
    check_rel(engine.get_lr().at(0), rec["lr_after_step"], 1e-12, at + " lr_after_step");
  }
  const auto& w = trace.final_weights;
  for (int64_t b = 0; b < 4; ++b) {
    check(std::fabs(model->weight[0][b].item<double>() - w["weight"][b].get<double>()) <= 1e-5,
          "final weight " + std::to_string(b));
  }
  check(std::fabs(model->bias[0].item<double>() - w["bias"][0].get<double>()) <= 1e-5,
        "final bias");
  std::cout << "rank " << rank << ": " << trace.micro.size() << " micro-steps compared, "
            << failures << " failures" << std::endl;
  return failures == 0 ? 0 : 1;
}

int run_train(int64_t mbs, int64_t gas, int64_t steps, int64_t bucket, const std::string& out,
              const torch::Device& device) {
  auto model = reference_linear();
  model->to(device);
  auto config = config_for(mbs, gas, bucket);
  config.steps_per_print = steps;  // one progress line, at the end: it names the backend
  auto engine = stepwise::initialize(model, config);
  if (stepwise::distributed::world_size() > 1) check_backend(device);
  const int64_t world = stepwise::distributed::world_size();
  const int64_t rank = stepwise::distributed::rank();
  const auto& reducer = engine.gradient_reducer();
  std::vector<torch::Tensor> params = model->parameters();
  const int64_t buckets =
      world == 1 ? 0 : stepwise::distributed::BucketedReducer(nullptr, bucket).num_buckets(params);
  // W > 1: the gradients live in the reducer's buckets (NOTE: [bucket views]): the same
  // storage at every micro-step, never reallocated or copied, zeros after each step.
  const void* storage = world > 1 ? model->weight.grad().data_ptr() : nullptr;
  for (int64_t t = 0; t < steps * gas; ++t) {
    auto [x, y] = reference_samples(reference_start(t, gas, mbs, world, rank), mbs);
    const int64_t before = reducer.all_reduce_calls();
    const bool boundary = engine.is_gradient_accumulation_boundary();
    engine.backward(torch::mse_loss(model->forward(x.to(device)), y.to(device)));
    engine.step();
    const int64_t calls = reducer.all_reduce_calls() - before;
    check(calls == (boundary ? buckets : 0),
          "micro-step " + std::to_string(t) + ": " + std::to_string(calls) +
              " all-reduce calls, expected " + std::to_string(boundary ? buckets : 0));
    if (world > 1) {
      check(model->weight.grad().defined() && model->weight.grad().data_ptr() == storage,
            "micro-step " + std::to_string(t) + ": the weight's gradient left its bucket");
    }
  }
  const auto* bucketed = dynamic_cast<const stepwise::distributed::BucketedReducer*>(&reducer);
  // This rank's loss of the last window: rank 0's progress line shows the ranks' mean.
  std::cout << "rank " << rank << ": window_loss " << std::setprecision(9)
            << engine.window_loss().item<double>() << std::endl;
  std::cout << "rank " << rank << ": " << buckets << " buckets, " << reducer.all_reduce_calls()
            << " all-reduce calls in " << steps << " steps, "
            << (bucketed ? bucketed->overlapped_calls() : 0) << " started during backward"
            << std::endl;
  std::ofstream file(out + "." + std::to_string(rank), std::ios::binary);
  for (const auto& p : params) {
    auto c = p.detach().to(torch::kCPU).contiguous();
    file.write(static_cast<const char*>(c.data_ptr()), c.numel() * sizeof(float));
  }
  stepwise::distributed::shutdown();
  return failures == 0 ? 0 : 1;
}

int run_kill() {
  stepwise::distributed::init(
      stepwise::distributed::InitOptions().timeout(std::chrono::seconds(10)));
  auto model = reference_linear();
  auto engine = stepwise::initialize(model, config_for(2, 2, 1000));
  const int64_t rank = stepwise::distributed::rank();
  for (int64_t t = 0; t < 12; ++t) {
    if (rank == 1 && t == 3) std::raise(SIGKILL);
    auto [x, y] = reference_samples(reference_start(t, 2, 2, 2, rank), 2);
    engine.backward(torch::mse_loss(model->forward(x), y));
    engine.step();
  }
  std::cout << "rank " << rank << " finished, which it should not have" << std::endl;
  return 0;
}

int run_mismatch(bool shapes) {
  const int64_t rank =
      stepwise::distributed::world_size_for_engine() > 1 ? stepwise::distributed::rank() : 0;
  std::shared_ptr<torch::nn::Module> model = reference_linear().ptr();
  if (shapes && rank == 1) model = torch::nn::Linear(5, 1).ptr();
  auto engine = stepwise::initialize(model, config_for(2, shapes ? 2 : 2 + rank, 1000));
  std::cout << "initialize did not throw" << std::endl;
  return 0;
}

// The token-level recipe of docs/accumulation-in-depth.md at W = 2 with unequal counts: one
// window (GAS 2) of 20 tokens, rank 0's micro-batches holding 3 and 9 of them, rank 1's 6
// and 2. Each rank all-reduces its count and divides its summed token losses by the global
// count / W, the GAS division off. Rank 0 prints the weights after the step, for the test to
// compare with one batch of all 20 tokens at W = 1.
int run_token_recipe() {
  auto [model, engine, all] = stepwise::testing::token_problem(1, 2);
  const int64_t rank = stepwise::distributed::rank();  // the group is joined by initialize
  const std::vector<int64_t> sizes =
      rank == 0 ? std::vector<int64_t>{3, 9} : std::vector<int64_t>{6, 2};
  int64_t first = rank == 0 ? 0 : 12;
  auto tokens = torch::full({1}, static_cast<double>(sizes[0] + sizes[1]), torch::kDouble);
  stepwise::distributed::default_context()->all_reduce_sum(tokens, "the window's tokens");
  const double divisor = tokens.item<double>() / stepwise::distributed::world_size();
  for (const int64_t n : sizes) {
    const auto token_losses = model->forward(all.narrow(0, first, n)).pow(2).squeeze(1);
    engine.backward(token_losses.sum() / divisor, stepwise::BackwardOptions().scale_wrt_gas(false));
    engine.step();
    first += n;
  }
  if (rank == 0) {
    std::cout << "tokens " << tokens.item<double>() << " weights" << std::setprecision(9);
    const auto weights = torch::cat({model->weight.flatten(), model->bias});
    for (int64_t i = 0; i < weights.numel(); ++i) std::cout << ' ' << weights[i].item<double>();
    std::cout << std::endl;
  }
  return engine.global_steps() == 1 ? 0 : 1;
}

// see NOTE: [construction order], observed from outside: Precision copies the fp32
// masters from the model once, when it casts it, so rank 0's weights must reach every
// rank before that. Broadcast after the cast, rank 1's masters (what the optimizer
// updates) would stay its own weights while its model showed rank 0's.
int run_broadcast_fp16() {
  const int64_t rank =
      stepwise::distributed::world_size_for_engine() > 1 ? stepwise::distributed::rank() : 0;
  const auto rank0_weight = torch::tensor({{0.1f, -0.2f, 0.3f, 0.7f}});
  const auto rank0_bias = torch::tensor({0.3f});
  auto model = reference_linear();
  {
    torch::NoGradGuard no_grad;
    model->weight.copy_(rank == 0 ? rank0_weight : torch::full({1, 4}, 7.0f));
    model->bias.copy_(rank == 0 ? rank0_bias : torch::full({1}, -3.0f));
  }
  auto config =
      stepwise::Config::from_json({{"train_micro_batch_size_per_gpu", 2},
                                   {"steps_per_print", 1000000000},
                                   {"fp16", {{"enabled", true}}},
                                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}}});
  auto engine = stepwise::initialize(model, config);
  const auto& masters = engine.master_params();
  const std::string at = "rank " + std::to_string(rank) + ": ";
  check(masters.size() == 2, at + "two master tensors");
  if (masters.size() != 2) return 1;
  check(masters[0].scalar_type() == torch::kFloat, at + "masters are fp32");
  // The masters are copied from the half model (as DeepSpeed's fp16 optimizer does).
  const auto rounded = [](const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); };
  check(masters[0].equal(rounded(rank0_weight)), at + "master weight is rank 0's weight");
  check(masters[1].equal(rounded(rank0_bias)), at + "master bias is rank 0's bias");
  check(model->weight.scalar_type() == torch::kHalf, at + "model is half");
  check(model->weight.equal(rank0_weight.to(torch::kHalf)),
        at + "model weight is rank 0's, rounded");
  check(model->bias.equal(rank0_bias.to(torch::kHalf)), at + "model bias is rank 0's, rounded");
  std::cout << at << failures << " failures" << std::endl;
  stepwise::distributed::shutdown();
  return failures == 0 ? 0 : 1;
}

}  // namespace

// Trains micro-steps [first, last) of the reference problem on this rank.
void train_range(torch::nn::Linear& model, stepwise::Engine& engine, int64_t first, int64_t last) {
  const int64_t world = stepwise::distributed::world_size();
  const int64_t rank = stepwise::distributed::rank();
  const int64_t gas = engine.gradient_accumulation_steps();
  for (int64_t t = first; t < last; ++t) {
    auto [x, y] = reference_samples(reference_start(t, gas, 2, world, rank), 2);
    engine.backward(torch::mse_loss(model->forward(x), y));
    engine.step();
  }
}

// Element-wise (fp16 runs on the CPU only without matmuls in LibTorch 1.13).
struct ScaleImpl : torch::nn::Module {
  torch::Tensor w = register_parameter("w", torch::linspace(0.2, 0.8, 4));
  torch::Tensor b = register_parameter("b", torch::full({1}, 0.1));
  torch::Tensor forward(const torch::Tensor& x) { return (x * w).sum(1) + b; }
};
TORCH_MODULE(Scale);

stepwise::Config checkpoint_config(const std::string& precision, bool scheduler, int64_t gas) {
  nlohmann::json json = {{"train_micro_batch_size_per_gpu", 2},
                         {"gradient_accumulation_steps", gas},
                         {"gradient_clipping", 0.5},
                         {"steps_per_print", 1000000000},
                         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.05}}}}}};
  if (scheduler) {
    json["scheduler"] = {{"type", "WarmupLR"},
                         {"params", {{"warmup_max_lr", 0.05}, {"warmup_num_steps", 3}}}};
  }
  if (precision == "fp16") json["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  if (precision == "bf16") json["bf16"] = {{"enabled", true}};
  return stepwise::Config::from_json(json);
}

// Micro-steps [first, last): this rank's own data, the same in every process.
void train_scale(Scale& model, stepwise::Engine& engine, const std::string& precision,
                 int64_t first, int64_t last) {
  const auto dtype = precision == "fp16"   ? torch::kHalf
                     : precision == "bf16" ? torch::kBFloat16
                                           : torch::kFloat;
  for (int64_t t = first; t < last; ++t) {
    torch::manual_seed(1000 + 2 * t + stepwise::distributed::rank());
    auto x = torch::randn({2, 4}).to(dtype);
    auto y = torch::randn({2}).to(dtype);
    engine.backward((model->forward(x) - y).pow(2).mean());
    engine.step();
  }
}

int run_checkpoint(const std::string& dir) {
  int64_t rank = 0;  // known once the first engine has joined the group
  int64_t cycles = 0;
  for (const std::string precision : {"fp32", "fp16", "bf16"}) {
    for (bool scheduler : {false, true}) {
      for (int64_t gas : {1, 4}) {
        const auto config = checkpoint_config(precision, scheduler, gas);
        const int64_t total = 2 * gas + 1;
        Scale whole_model;
        auto whole = stepwise::initialize(whole_model, config);
        rank = stepwise::distributed::rank();
        train_scale(whole_model, whole, precision, 0, total);
        for (int64_t k = gas; k <= 2 * gas; ++k) {  // every position of the second window
          const std::string tag =
              c10::str(precision, scheduler ? "-sched" : "", "-gas", gas, "-k", k);
          Scale first_model;
          auto first = stepwise::initialize(first_model, config);
          train_scale(first_model, first, precision, 0, k);
          first.save_checkpoint(dir, stepwise::SaveOptions().tag(tag));
          // This rank's generator at the save (train_scale seeds it by rank), then another.
          const auto saved_rng = at::detail::getDefaultCPUGenerator().get_state();
          torch::manual_seed(999);
          Scale resumed_model;
          auto resumed = stepwise::initialize(resumed_model, config);
          resumed.load_checkpoint(dir);
          check(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), saved_rng),
                c10::str("rank ", rank, ", ", tag,
                         ": the load did not restore this rank's CPU generator"));
          train_scale(resumed_model, resumed, precision, k, total);
          const std::string where = c10::str("rank ", rank, ", ", tag, ": ");
          bool same = torch::equal(resumed_model->w, whole_model->w) &&
                      torch::equal(resumed_model->b, whole_model->b);
          for (size_t i = 0; i < whole.master_params().size(); ++i) {
            same = same && torch::equal(resumed.master_params()[i], whole.master_params()[i]);
          }
          check(same, where + "weights differ from the uninterrupted run");
          check(resumed.micro_steps() == whole.micro_steps() &&
                    resumed.global_steps() == whole.global_steps() &&
                    resumed.global_samples() == whole.global_samples() &&
                    resumed.get_lr() == whole.get_lr() &&
                    resumed.loss_scale() == whole.loss_scale(),
                where + "counters, lr or loss scale differ");
          const auto& a = resumed_model->w.grad();
          const auto& b = whole_model->w.grad();
          check(a.defined() == b.defined() && (!a.defined() || torch::equal(a, b)),
                where + "this rank's pending gradient differs");
          cycles += 1;
        }
      }
    }
  }
  // Different tags on the ranks: Fail refuses on every rank and writes nothing; Warn
  // saves under rank 0's tag on every rank.
  for (const std::string validation : {"Fail", "Warn"}) {
    auto model = reference_linear();
    nlohmann::json json = {{"train_micro_batch_size_per_gpu", 2},
                           {"gradient_accumulation_steps", 2},
                           {"steps_per_print", 1000000000},
                           {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}},
                           {"checkpoint", {{"tag_validation", validation}}}};
    auto engine = stepwise::initialize(model, stepwise::Config::from_json(json));
    std::string error;
    std::string path;
    try {
      path = engine.save_checkpoint(
          dir, stepwise::SaveOptions().tag(validation + "-rank" + std::to_string(rank)));
    } catch (const stepwise::CheckpointError& e) {
      error = e.what();
    }
    if (validation == "Fail") {
      check(error.find("the ranks passed different checkpoint tags") != std::string::npos,
            "tag validation Fail: got \"" + error + "\"");
    } else {
      check(error.empty() && path == dir + "/Warn-rank0",
            "tag validation Warn: saved as \"" + path + "\", error \"" + error + "\"");
    }
  }
  // An error on one rank reaches every rank (no rank waits for the others until the
  // timeout), and no rank's engine changes: rank 1's window file is missing.
  {
    const auto config = checkpoint_config("fp32", false, 4);
    Scale saved_model;
    auto saved = stepwise::initialize(saved_model, config);
    train_scale(saved_model, saved, "fp32", 0, 6);
    const std::string path = saved.save_checkpoint(dir, stepwise::SaveOptions().tag("no-window-1"));
    stepwise::distributed::default_context()->barrier("test: saved");
    if (rank == 0) std::filesystem::remove(path + "/window_rank_1.pt");
    stepwise::distributed::default_context()->barrier("test: file removed");
    Scale model;
    auto engine = stepwise::initialize(model, config);
    std::string error;
    try {
      engine.load_checkpoint(dir, stepwise::LoadOptions().tag("no-window-1"));
    } catch (const stepwise::CheckpointError& e) {
      error = e.what();
    }
    const std::string expected =
        rank == 1 ? "window_rank_1.pt is missing"
                  : "checkpoint load: reading and checking failed on rank 1 (its own "
                    "CheckpointError says why)";
    check(error.find(expected) != std::string::npos,
          "a missing window file on rank 1: got \"" + error + "\"");
    // (a fresh engine at W = 2: its gradients are zeros in the buckets, NOTE: [bucket views])
    check(engine.micro_steps() == 0 && model->w.grad().defined() &&
              model->w.grad().abs().sum().item<double>() == 0.0,
          "a failed load left this rank's engine changed");
  }
  // A checkpoint saved inside a window at W = 1 (by the test, before the ranks started):
  // its pending gradients belong to one rank; every rank refuses it, none waits.
  {
    Scale model;
    auto engine = stepwise::initialize(model, checkpoint_config("fp32", false, 4));
    std::string error;
    try {
      engine.load_checkpoint(dir, stepwise::LoadOptions().tag("w1-mid"));
    } catch (const stepwise::CheckpointError& e) {
      error = e.what();
    }
    check(error.find("was saved inside an accumulation window (2 micro-batches pending) with "
                     "world size 1 (now 2)") != std::string::npos,
          "a W = 1 mid-window checkpoint at W = 2: got \"" + error + "\"");
  }
  std::cout << "rank " << rank << ": checkpoint resume checked in " << cycles
            << " save/load cycles, " << failures << " failures" << std::endl;
  stepwise::distributed::shutdown();
  return failures == 0 ? 0 : 1;
}

// fp16, W = 2: an inf in rank 1's gradients only (at the boundary micro-step of the
// second window) skips that step on both ranks, with no collective beyond the
// gradients' own all-reduce (the inf is in the sum), and the ranks stay identical.
int run_overflow() {
  Scale model;
  auto engine = stepwise::initialize(model, checkpoint_config("fp16", false, 2));
  const int64_t rank = stepwise::distributed::rank();
  const auto& reducer = engine.gradient_reducer();
  for (int64_t t = 0; t < 6; ++t) {
    torch::manual_seed(1000 + 2 * t + rank);
    auto x = torch::randn({2, 4}).to(torch::kHalf);
    auto loss = (model->forward(x) - 1.0).pow(2).mean();
    if (rank == 1 && t == 3) loss = loss * std::numeric_limits<float>::infinity();
    const int64_t calls = reducer.all_reduce_calls();
    engine.backward(loss);
    engine.step();
    if (t == 3) {
      check(!engine.was_step_applied(), "rank " + std::to_string(rank) + ": step 2 was applied");
      check(reducer.all_reduce_calls() - calls == 1, "an extra collective at the overflow");
    }
  }
  check(engine.skipped_steps() == 1 && engine.global_steps() == 3,
        "skipped " + std::to_string(engine.skipped_steps()) + " of " +
            std::to_string(engine.global_steps()) + " steps, expected 1 of 3");
  const auto all = stepwise::distributed::default_context()->all_gather(
      engine.master_params()[0].detach(), "test: the masters");
  check(torch::equal(all[0], all[1]), "the ranks' fp32 masters differ");
  std::cout << "rank " << rank << ": overflow on rank 1 skipped " << engine.skipped_steps()
            << " step on this rank, loss scale " << engine.loss_scale() << ", " << failures
            << " failures" << std::endl;
  stepwise::distributed::shutdown();
  return failures == 0 ? 0 : 1;
}

// Rank 1 dies (SIGKILL) inside a save: once its window file of "after" is written, while
// it waits for rank 0 to finish writing the shared files (64 MiB, flushed to disk).
int run_kill_save(const std::string& dir) {
  stepwise::distributed::init(
      stepwise::distributed::InitOptions().timeout(std::chrono::seconds(10)));
  torch::nn::Linear model(4096, 4096);
  auto engine = stepwise::initialize(model, config_for(2, 2, 1 << 26));
  const int64_t rank = stepwise::distributed::rank();
  engine.save_checkpoint(dir, stepwise::SaveOptions().tag("before"));
  std::thread killer;
  if (rank == 1) {
    killer = std::thread([dir] {
      const std::string mine = dir + "/.after.partial/window_rank_1.pt.sum";
      while (!std::filesystem::exists(mine))
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::raise(SIGKILL);
    });
  }
  try {
    engine.save_checkpoint(dir, stepwise::SaveOptions().tag("after"));
  } catch (const std::exception& e) {
    std::cout << "rank " << rank << " save failed: " << e.what() << std::endl;
    return 0;
  }
  std::cout << "rank " << rank << " finished the save, which it should not have" << std::endl;
  if (killer.joinable()) killer.join();
  return 1;
}

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 2 && args.size() <= 4 && args[0] == "trace") {
      return run_trace(args[1], device_of(args.size() >= 3 ? args[2] : "cpu"),
                       args.size() == 4 ? std::stoll(args[3]) : 0);
    }
    if ((args.size() == 6 || args.size() == 7) && args[0] == "train") {
      return run_train(std::stoll(args[1]), std::stoll(args[2]), std::stoll(args[3]),
                       std::stoll(args[4]), args[5], device_of(args.size() == 7 ? args[6] : "cpu"));
    }
    if (args.size() == 1 && args[0] == "kill") return run_kill();
    if (args.size() == 1 && args[0] == "mismatch-gas") return run_mismatch(false);
    if (args.size() == 1 && args[0] == "mismatch-shape") return run_mismatch(true);
    if (args.size() == 1 && args[0] == "broadcast-fp16") return run_broadcast_fp16();
    if (args.size() == 1 && args[0] == "token-recipe") return run_token_recipe();
    if (args.size() == 2 && args[0] == "checkpoint") return run_checkpoint(args[1]);
    if (args.size() == 2 && args[0] == "kill-save") return run_kill_save(args[1]);
    if (args.size() == 1 && args[0] == "overflow") return run_overflow();
    // The ZeRO modes (tests/distributed/zero_worker.cpp): in a group joined here.
    const auto in_group = [](const auto& run) {
      stepwise::distributed::init();
      const int failed = run(stepwise::distributed::rank(), stepwise::distributed::world_size());
      stepwise::distributed::shutdown();
      return failed == 0 ? 0 : 1;
    };
    if (args.size() == 2 && args[0] == "zero-reshard") {
      return in_group([&](int64_t r, int64_t w) { return run_zero_reshard(args[1], r, w); });
    }
    if (args.size() == 2 && args[0] == "zero-checkpoint") {
      return in_group([&](int64_t r, int64_t w) { return run_zero_checkpoint(args[1], r, w); });
    }
    if (args.size() == 1 && args[0] == "zero") return in_group(run_zero_matrix);
  } catch (const std::exception& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 3;
  }
  std::cerr << "usage: see the comment at the top of tests/distributed/worker.cpp\n";
  return 2;
}
