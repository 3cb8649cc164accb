#include <stepwise/clip.h>
#include <stepwise/engine.h>
#include <stepwise/optimizers.h>

#include <torch/torch.h>

#include "check.h"
#include "engine_state.h"
#include "leftover_checks.h"
#include "param_groups.h"
#include "zero.h"
#include "zero_gradients.h"

#include <iomanip>
#include <iostream>
#include <sstream>

namespace stepwise {

namespace {

using Clock = std::chrono::steady_clock;

// W > 1: checks that the ranks agree and broadcasts rank 0's parameters (see NOTE:
// [construction order]).
std::unique_ptr<distributed::GradientReducer> make_reducer(torch::nn::Module& model,
                                                           const Config& config,
                                                           const BatchSizes& sizes) {
  std::vector<torch::Tensor> params;
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return distributed::make_gradient_reducer(
      params, config.reducer,
      {{"gradient_accumulation_steps", sizes.gradient_accumulation_steps},
       {"train_micro_batch_size_per_gpu", sizes.micro_batch},
       {"train_batch_size", sizes.train_batch_size},
       {"stepwise.reduce_bucket_size", config.reducer.bucket_size()}});
}

torch::nn::Module& non_null(const std::shared_ptr<torch::nn::Module>& model) {
  STEPWISE_CHECK(model != nullptr, ConfigError, "stepwise::initialize got a null model");
  return *model;
}

std::unique_ptr<torch::optim::Optimizer> choose_optimizer(
    const Config& config, std::unique_ptr<torch::optim::Optimizer> client, Precision& precision) {
  STEPWISE_CHECK(!(client && config.optimizer), ConfigError,
                 "both a client optimizer and an \"optimizer\" config section (type \"",
                 config.optimizer ? config.optimizer->type() : "",
                 "\") were given; remove one "
                 "of them");
  if (client) {
    precision.adopt(*client);  // fp16/bf16: it steps the fp32 masters
    return client;
  }
  STEPWISE_CHECK(config.optimizer.has_value(), ConfigError,
                 "no optimizer: add an \"optimizer\" section to the config (for example "
                 "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}) or pass one to "
                 "stepwise::initialize");
  return make_optimizer(*config.optimizer, precision.optimizer_params());
}

std::string describe(const torch::Tensor& loss) {
  if (!loss.defined()) return "an undefined tensor";
  return c10::str("a ", loss.scalar_type(), " tensor of shape ", loss.sizes(),
                  loss.requires_grad() ? " that requires grad" : " that does not require grad");
}

// The run's optimizer steps, where the config's schedule says (for the progress line's ETA).
std::optional<int64_t> planned_steps(const Config& config) {
  if (!config.scheduler) return std::nullopt;
  if (const auto* o = std::get_if<WarmupDecayLROptions>(&*config.scheduler)) {
    return o->total_num_steps();
  }
  if (const auto* o = std::get_if<WarmupCosineLROptions>(&*config.scheduler)) {
    return o->total_num_steps();
  }
  return std::nullopt;
}

// Where the model's parameters are (the CPU for a model without any, or none: the
// constructor's checks name that).
torch::Device params_device(const torch::nn::Module* model) {
  if (model == nullptr) return torch::kCPU;
  const auto params = model->parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

// ZeRO-Offload of the optimizer to the CPU (NOTE: [ZeRO-Offload] in config_sections.cpp):
// with the parameters on the CPU, a note; on CUDA, or with an optimizer DeepSpeed would
// refuse there, a ConfigError.
void check_offload(Config& config, const torch::Device& device, bool client_optimizer) {
  if (!config.zero.offload_optimizer()) return;
  STEPWISE_CHECK(!device.is_cuda(), ConfigError,
                 "zero_optimization.offload_optimizer moves the optimizer state and fp32 masters "
                 "of CUDA parameters to host memory (ZeRO-Offload), which stepwise does not "
                 "implement: remove it or set its \"device\" to \"none\" (they stay on the GPU)");
  STEPWISE_CHECK(!client_optimizer || !config.zero.force_ds_cpu_optimizer(), ConfigError,
                 "zero_optimization.offload_optimizer with an optimizer passed to initialize: "
                 "DeepSpeed refuses that (it steps offloaded state with its own CPU Adam) unless "
                 "\"zero_force_ds_cpu_optimizer\": false; set that, or name the optimizer in the "
                 "config's \"optimizer\" section");
  config.notes.push_back(
      "zero_optimization.offload_optimizer \"cpu\": the parameters are on the CPU, so their "
      "optimizer state and fp32 masters are in host memory already; nothing moves");
}

}  // namespace

Engine::State::State(std::shared_ptr<torch::nn::Module> model, Config config,
                     std::unique_ptr<torch::optim::Optimizer> client_optimizer,
                     std::unique_ptr<torch::optim::LRScheduler> client_scheduler)
    : model_(std::move(model)),
      config_(std::move(config)),
      // Joins the process group from torchrun's variables when WORLD_SIZE > 1, with the
      // backend of the parameters' device (NCCL for CUDA, Gloo otherwise).
      accumulator_(config_.resolve_batch_sizes(
                       distributed::world_size_for_engine(params_device(model_.get()))),
                   config_.accumulation) {
  // NOTE: [construction order] the steps below depend on each other's effects, so they
  // run here, in this order, not in the member initializer list (where the order of
  // the declarations would decide it):
  // 1. the reducer checks that the ranks agree and broadcasts rank 0's parameters;
  // 2. then Precision casts the model to half/bf16 and copies the fp32 masters from it,
  //    once: broadcast after this, a rank's masters (what the optimizer updates) would
  //    stay its own weights while its model showed rank 0's;
  // 3. then (ZeRO stages 1 and 2) the masters of other ranks' parameters are dropped (and
  //    at stage 2 the reducer becomes one that sums the gradients into their owners), and
  //    the optimizer is built over the masters, and attached to the precision.
  // tests/distributed (RankZerosWeightsReachEveryRankBeforeTheFp16Cast) checks 1-2.
  check_offload(config_, params_device(model_.get()), client_optimizer != nullptr);
  reducer_ = make_reducer(non_null(model_), config_, accumulator_.sizes());
  precision_ = Precision::make(config_.precision, *model_);
  // ZeRO stages 1 and 2: this rank keeps (and its optimizer steps) its share's masters only.
  zero_ = std::make_unique<detail::ZeroShards>(
      config_.zero, precision_->model_params(),
      accumulator_.sizes().world_size > 1 ? distributed::default_context() : nullptr);
  if (zero_->sharded()) {
    const detail::ZeroShards* zero = zero_.get();
    precision_->shard(zero_->owned(), [zero](torch::Tensor& t) { zero->sum_over_ranks(t); });
  }
  // ZeRO stage 2: the gradients, too, are summed into their owners, every micro-step.
  if (zero_->sharded() && config_.zero.stage() == 2) {
    reducer_ = std::make_unique<detail::ShardedGradients>(
        distributed::default_context(), zero_->owners(), config_.reducer.bucket_size(),
        config_.reducer.overlap_comm(),
        config_.reducer.prescale_gradients() ? static_cast<double>(accumulator_.sizes().world_size)
                                             : config_.reducer.gradient_predivide_factor());
  }
  optimizer_ = choose_optimizer(config_, std::move(client_optimizer), *precision_);
  precision_->attach(*optimizer_);
  folds_ = dynamic_cast<TakesGradScale*>(optimizer_.get());  // see NOTE: [folded unscale]
  // 4. then, with the model's final dtype, the reducer makes the gradients bucket views.
  reducer_->attach(precision_->model_params());
  STEPWISE_CHECK(!(client_scheduler && config_.scheduler), ConfigError,
                 "both a client LR scheduler and a \"scheduler\" config section (type \"",
                 config_.scheduler ? schedule_type(*config_.scheduler) : "",
                 "\") were given; stepwise refuses to guess which wins: remove one of them");
  if (client_scheduler) {
    scheduler_ = std::move(client_scheduler);
  } else if (config_.scheduler) {
    scheduler_ = make_scheduler(*config_.scheduler, *optimizer_);
  }
  if (scheduler_) scheduler_steps_at_start_ = scheduler_step_count(*scheduler_);
  const int64_t world_size = accumulator_.sizes().world_size;
  detail::AllReduceSum all_reduce_sum;
  if (world_size > 1) {
    all_reduce_sum = [](torch::Tensor& t) {
      distributed::default_context()->all_reduce_sum(t, "the progress line's loss and tokens");
    };
  }
  monitor_ = std::make_unique<detail::Monitor>(config_.csv_monitor, config_.steps_per_print,
                                               distributed::rank() == 0, planned_steps(config_),
                                               std::move(all_reduce_sum), world_size);
  leftover_checks_ = std::make_unique<detail::LeftoverChecks>(
      config_.guard_rails, detail::trainable_names(*model_), precision_->model_params(),
      precision_->optimizer_params(), precision_->owned());
  // What the config asks for that has no effect here: said once, by rank 0.
  if (distributed::rank() == 0) {
    for (const auto& note : config_.notes) std::cerr << "stepwise: note: " << note << "\n";
  }
}

Engine::State::~State() = default;

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config config,
                  std::unique_ptr<torch::optim::Optimizer> optimizer,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler) {
  return Engine(std::move(model), std::move(config), std::move(optimizer), std::move(lr_scheduler));
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config config,
                  std::vector<ParamGroup> param_groups,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler) {
  STEPWISE_CHECK(config.optimizer.has_value(), ConfigError,
                 "parameter groups were given, but the config has no \"optimizer\" section to "
                 "build over them: add one (for example {\"type\": \"AdamW\", \"params\": "
                 "{\"lr\": 0.001}}), or build your optimizer over the groups and pass it instead");
  detail::check_param_groups(non_null(model), param_groups);
  // Built here, over the model's parameters in groups, the engine adopts it as it adopts a
  // client's: under fp16/bf16 each parameter becomes its fp32 master, in its group.
  auto optimizer = make_optimizer(*config.optimizer, param_groups);
  config.optimizer.reset();
  // It is the config's optimizer, over the groups, not a client's (NOTE: [ZeRO-Offload]).
  config.zero.force_ds_cpu_optimizer(false);
  return Engine(std::move(model), std::move(config), std::move(optimizer), std::move(lr_scheduler));
}

torch::Tensor Engine::State::backward(const torch::Tensor& loss, const BackwardOptions& options) {
  const bool valid =
      loss.defined() && loss.is_floating_point() && loss.dim() == 0 && loss.requires_grad();
  STEPWISE_CHECK(valid, UsageError,
                 "engine.backward(loss) needs a defined, floating-point, 0-dim loss that "
                 "requires grad (the mean over the micro-batch), got ",
                 describe(loss),
                 (loss.defined() && loss.dim() > 0 ? "; reduce it first, e.g. loss.mean()" : ""));
  STEPWISE_CHECK(options.tokens() >= 0, UsageError, "BackwardOptions().tokens(", options.tokens(),
                 "): a micro-batch's token count is >= 0 (0: not reported)");
  leftover_checks_->before_backward(accumulator_.micro_steps());
  const bool scale = options.scale_wrt_gas().value_or(accumulator_.options().scale_wrt_gas());
  accumulator_.on_backward(scale);
  const auto start = Clock::now();
  // FACT 1 and 2: the engine divides by GAS and returns what it backpropagated.
  torch::Tensor scaled = scale ? loss / static_cast<double>(accumulator_.gas()) : loss;
  // W > 1: the backward that ends a window (counted, not set by hand: then several may
  // come before the step) starts each bucket's all-reduce once the bucket is full.
  reducer_->before_backward(config_.reducer.overlap_comm() && !accumulator_.manual_boundary() &&
                            accumulator_.is_boundary());
  try {
    precision_->scale_loss(scaled).backward();  // * S inside for fp16; never in the return
  } catch (...) {
    reducer_->abort_backward();
    throw;
  }
  reducer_->after_backward();
  leftover_checks_->after_backward(accumulator_.is_boundary());
  backward_time_ += Clock::now() - start;
  scaled = scaled.detach();
  window_losses_.add(scaled);
  monitor_->on_backward(options.tokens());
  return scaled;
}

void Engine::State::check_scheduler_not_stepped_elsewhere() const {
  if (!scheduler_) return;
  const int64_t seen = scheduler_step_count(*scheduler_) - scheduler_steps_at_start_;
  STEPWISE_CHECK(seen == scheduler_steps_taken_, UsageError,
                 "the LR scheduler owned by the engine was stepped outside it: it has taken ", seen,
                 seen == 1 ? " step" : " steps", ", the engine stepped it ", scheduler_steps_taken_,
                 scheduler_steps_taken_ == 1 ? " time" : " times",
                 ". Remove your scheduler.step() call: engine.step() steps the scheduler "
                 "at each accumulation boundary (not on skipped steps). See ",
                 kCadenceDocs, ", pitfall 3.");
}

void Engine::State::check_before_step(bool boundary) {
  check_scheduler_not_stepped_elsewhere();
  leftover_checks_->before_step(accumulator_.micro_steps(), boundary);
}

void Engine::State::step() {
  accumulator_.check_step();
  const bool boundary = accumulator_.is_boundary();
  check_before_step(boundary);
  was_step_applied_ = false;  // as DeepSpeed: true only after a step() that stepped
  if (!boundary) {
    accumulator_.on_step();
    return;
  }
  if (!accumulator_.manual_boundary()) {
    boundary_step(accumulator_.window_samples(/*ends_early=*/false), /*grad_factor=*/1.0,
                  /*ends_early=*/false);
    return;
  }
  boundary_step(accumulator_.window_samples(/*ends_early=*/true), accumulator_.early_end_factor(),
                /*ends_early=*/true);
}

bool Engine::State::flush() {
  STEPWISE_CHECK(!accumulator_.awaiting_step(), UsageError,
                 "engine.flush() was called right after engine.backward(): call engine.step() "
                 "first (after every backward()), then flush() at the end of the epoch. See ",
                 kCadenceDocs, ".");
  const int64_t k = accumulator_.window_backwards();
  check_before_step(/*boundary=*/k > 0);
  if (k == 0) return false;
  // The k pending micro-batches were each divided by GAS: make it a mean over k.
  boundary_step(accumulator_.window_samples(/*ends_early=*/true), accumulator_.early_end_factor(),
                /*ends_early=*/true);
  return true;
}

void Engine::State::set_gradient_accumulation_boundary(bool is_boundary) {
  accumulator_.set_manual_boundary(is_boundary);
}

void Engine::State::clear_gradient_accumulation_boundary() {
  STEPWISE_CHECK(accumulator_.window_backwards() == 0, UsageError,
                 "engine.clear_gradient_accumulation_boundary() was called inside a window (",
                 accumulator_.window_backwards(),
                 accumulator_.window_backwards() == 1 ? " backward() call" : " backward() calls",
                 " pending): counting would end that window as if it had GAS micro-batches. End "
                 "it first (a step() with the boundary set to true, or flush()), then clear it");
  accumulator_.set_manual_boundary(std::nullopt);
}

torch::Tensor Engine::State::window_loss() const {
  torch::Tensor loss = window_losses_.last_loss();
  STEPWISE_CHECK(loss.defined(), UsageError,
                 "engine.window_loss() was called before the first accumulation window ended: "
                 "read it after a step() at the boundary (is_gradient_accumulation_boundary() "
                 "before that step(), or global_steps() > 0) or after flush()");
  return loss;
}

void Engine::State::boundary_step(int64_t samples, double grad_factor, bool ends_early) {
  const auto start = Clock::now();
  // After the all-reduce every rank holds the same mean gradients, so the norm
  // and the overflow flag below are global: an inf on one rank is an inf in the
  // sum on every rank, and every rank skips, clips and steps identically.
  reducer_->reduce(precision_->model_params());
  // Unscale (fp16) and check for overflow; one host sync for the norm and the flag. An
  // optimizer that TakesGradScale does the unscale and the clip in its own pass (NOTE:
  // [folded unscale]): two passes over the gradients in all.
  // The reducer summed: its 1/W joins the unscale (NOTE: [bucket views]).
  const double factor = grad_factor * reducer_->mean_factor();
  const GradientStats stats =
      folds_ ? precision_->check_unscaled(factor) : precision_->unscale_and_check(factor);
  global_grad_norm_ = stats.norm;
  const bool skip = stats.overflow;  // an fp16 overflow skips the optimizer AND the scheduler
  if (!skip) {
    if (folds_) {
      folds_->step_with_grad_scale(precision_->grad_scale(factor) *
                                   clip_coefficient(stats.norm, config_.gradient_clipping));
    } else {
      clip_grads_with_norm(precision_->optimizer_params(), stats.norm, config_.gradient_clipping);
      optimizer_->step();
    }
    precision_->copy_to_model();
    zero_->gather(precision_->model_params());  // ZeRO: from each owner to every rank
  }
  precision_->zero_grads();   // set_to_none, also after a skipped step
  reducer_->restore_grads();  // W > 1: zeros in the buckets instead (NOTE: [bucket views])
  if (scheduler_ && !skip) {
    scheduler_->step();
    scheduler_steps_taken_ += 1;
  }
  precision_->finish_boundary(skip);
  leftover_checks_->after_boundary(!skip);
  window_losses_.end_window(grad_factor);
  was_step_applied_ = !skip;
  if (ends_early) {
    accumulator_.on_flush(skip, samples);
  } else {
    accumulator_.on_boundary(skip, samples);
  }
  step_time_ += Clock::now() - start;
  detail::StepReport report;
  report.global_steps = accumulator_.global_steps();
  report.global_samples = accumulator_.global_samples();
  report.skipped_steps = accumulator_.skipped_steps();
  report.window_losses = window_losses_.last;
  report.loss_factor = window_losses_.last_factor;
  report.lrs = get_lr();
  report.grad_norm = global_grad_norm_;
  if (precision_->scaler() != nullptr) report.loss_scale = precision_->loss_scale();
  const std::string line = monitor_->on_step(std::move(report));
  if (!line.empty()) print_progress(line);
}

std::vector<double> Engine::State::get_lr() const { return current_lrs(*optimizer_); }

void Engine::State::print_progress(const std::string& monitor_line) const {
  std::ostringstream line;
  line << monitor_line;
  if (accumulator_.global_steps() == config_.steps_per_print &&
      accumulator_.sizes().world_size > 1) {
    // The first line says how the ranks talk (the backend follows the device if unset).
    const auto ctx = distributed::default_context();
    line << " (data parallel: " << accumulator_.sizes().world_size << " ranks over "
         << (ctx ? ctx->backend_name() : std::string("?")) << ")";
  }
  if (config_.wall_clock_breakdown) {
    using ms = std::chrono::duration<double, std::milli>;
    line << std::fixed << std::setprecision(3) << " backward_ms=" << ms(backward_time_).count()
         << " step_ms=" << ms(step_time_).count();
  }
  std::cerr << line.str() << "\n";
}

}  // namespace stepwise
