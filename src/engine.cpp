#include <stepwise/clip.h>
#include <stepwise/engine.h>
#include <stepwise/optimizers.h>

#include <torch/torch.h>

#include <iomanip>
#include <iostream>

namespace stepwise {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<torch::Tensor> trainable_parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> choose_optimizer(
    const Config& config, std::unique_ptr<torch::optim::Optimizer> client,
    const std::vector<torch::Tensor>& params) {
  STEPWISE_CHECK(!(client && config.optimizer), ConfigError,
                 "both a client optimizer and an \"optimizer\" config section (type \"",
                 config.optimizer ? config.optimizer->type : "",
                 "\") were given; remove one "
                 "of them");
  if (client) return client;
  STEPWISE_CHECK(config.optimizer.has_value(), ConfigError,
                 "no optimizer: add an \"optimizer\" section to the config (for example "
                 "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}) or pass one to "
                 "stepwise::initialize");
  return make_optimizer(*config.optimizer, params);
}

std::string describe(const torch::Tensor& loss) {
  if (!loss.defined()) return "an undefined tensor";
  return c10::str("a ", loss.scalar_type(), " tensor of shape ", loss.sizes(),
                  loss.requires_grad() ? " that requires grad" : " that does not require grad");
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config,
               std::unique_ptr<torch::optim::Optimizer> client_optimizer,
               std::unique_ptr<torch::optim::LRScheduler> client_scheduler)
    : model_(std::move(model)),
      config_(std::move(config)),
      // Joins the process group from torchrun's variables when WORLD_SIZE > 1.
      sizes_(config_.resolve_batch_sizes(distributed::world_size_for_engine())),
      accumulator_(sizes_.gradient_accumulation_steps, config_.stepwise.strict_cadence) {
  STEPWISE_CHECK(model_ != nullptr, ConfigError, "stepwise::initialize got a null model");
  STEPWISE_CHECK(!config_.fp16.enabled && !config_.bf16.enabled, ConfigError,
                 (config_.fp16.enabled ? "fp16" : "bf16"),
                 ".enabled is true, but mixed precision is not implemented in this version of "
                 "stepwise; set it to false (train in fp32)");
  params_ = trainable_parameters(*model_);
  STEPWISE_CHECK(!params_.empty(), ConfigError,
                 "the model has no parameters that require grad; nothing to train");
  // W > 1: checks the ranks agree, broadcasts rank 0's parameters.
  reducer_ = distributed::make_gradient_reducer(params_, config_, sizes_);
  optimizer_ = choose_optimizer(config_, std::move(client_optimizer), params_);
  STEPWISE_CHECK(!(client_scheduler && config_.scheduler), ConfigError,
                 "both a client LR scheduler and a \"scheduler\" config section (type \"",
                 config_.scheduler ? config_.scheduler->type : "",
                 "\") were given; stepwise refuses to guess which wins: remove one of them");
  if (client_scheduler) {
    scheduler_ = std::move(client_scheduler);
  } else if (config_.scheduler) {
    scheduler_ = make_scheduler(*config_.scheduler, *optimizer_);
  }
  if (scheduler_) scheduler_steps_at_start_ = scheduler_step_count(*scheduler_);
}

Engine initialize(std::shared_ptr<torch::nn::Module> model, Config config,
                  std::unique_ptr<torch::optim::Optimizer> optimizer,
                  std::unique_ptr<torch::optim::LRScheduler> lr_scheduler) {
  return Engine(std::move(model), std::move(config), std::move(optimizer), std::move(lr_scheduler));
}

torch::Tensor Engine::backward(const torch::Tensor& loss, const BackwardOptions& options) {
  const bool valid =
      loss.defined() && loss.is_floating_point() && loss.dim() == 0 && loss.requires_grad();
  STEPWISE_CHECK(valid, UsageError,
                 "engine.backward(loss) needs a defined, floating-point, 0-dim loss that "
                 "requires grad (the mean over the micro-batch), got ",
                 describe(loss),
                 (loss.defined() && loss.dim() > 0 ? "; reduce it first, e.g. loss.mean()" : ""));
  accumulator_.on_backward();
  const auto start = Clock::now();
  const bool scale = options.scale_wrt_gas().value_or(config_.stepwise.scale_wrt_gas);
  // FACT 1 and 2: the engine divides by GAS and returns what it backpropagated.
  torch::Tensor scaled =
      scale ? loss / static_cast<double>(sizes_.gradient_accumulation_steps) : loss;
  scaled.backward();
  backward_time_ += Clock::now() - start;
  return scaled.detach();
}

void Engine::check_scheduler_not_stepped_elsewhere() const {
  if (!scheduler_) return;
  const int64_t seen = scheduler_step_count(*scheduler_) - scheduler_steps_at_start_;
  STEPWISE_CHECK(seen == scheduler_steps_taken_, UsageError,
                 "the LR scheduler owned by the engine was stepped outside it: it has taken ", seen,
                 " steps, the engine stepped it ", scheduler_steps_taken_,
                 " times. Remove your scheduler.step() call: engine.step() steps the scheduler "
                 "at each accumulation boundary (not on skipped steps). See ",
                 kCadenceDocs, ", pitfall 3.");
}

void Engine::step() {
  accumulator_.check_step();
  check_scheduler_not_stepped_elsewhere();
  was_step_applied_ = false;  // as DeepSpeed: true only after a step() that stepped
  if (!accumulator_.is_boundary()) {
    accumulator_.on_step(false, false, 0);
    return;
  }
  boundary_step(sizes_.train_batch_size, /*flushing=*/false);
}

bool Engine::flush() {
  STEPWISE_CHECK(!accumulator_.awaiting_step(), UsageError,
                 "engine.flush() was called right after engine.backward(): call engine.step() "
                 "first (after every backward()), then flush() at the end of the epoch. See ",
                 kCadenceDocs, ".");
  check_scheduler_not_stepped_elsewhere();
  const int64_t k = accumulator_.pending();
  if (k == 0) return false;
  {
    // The k pending micro-batches were each divided by GAS: make it a mean over k.
    torch::NoGradGuard no_grad;
    const double factor =
        static_cast<double>(sizes_.gradient_accumulation_steps) / static_cast<double>(k);
    for (auto& p : params_) {
      if (p.grad().defined()) p.grad().mul_(factor);
    }
  }
  boundary_step(k * sizes_.micro_batch * sizes_.world_size, /*flushing=*/true);
  return true;
}

void Engine::boundary_step(int64_t samples, bool flushing) {
  const auto start = Clock::now();
  // After the all-reduce every rank holds the same mean gradients, so the norm
  // below is global and every rank clips and steps identically.
  reducer_->reduce(params_);
  global_grad_norm_ = clip_grad_norm(params_, config_.gradient_clipping);
  optimizer_->step();
  for (auto& p : params_) {
    p.mutable_grad() = torch::Tensor();  // set_to_none
  }
  if (scheduler_) {
    scheduler_->step();
    scheduler_steps_taken_ += 1;
  }
  was_step_applied_ = true;
  if (flushing) {
    accumulator_.on_flush(false, samples);
  } else {
    accumulator_.on_step(true, false, samples);
  }
  step_time_ += Clock::now() - start;
  if (global_steps() % config_.steps_per_print == 0) print_progress();
}

std::vector<double> Engine::get_lr() const { return current_lrs(*optimizer_); }

void Engine::print_progress() const {
  std::ostringstream line;
  line << "[stepwise] step=" << global_steps() << " skipped=" << skipped_steps()
       << " samples=" << global_samples() << " lr=";
  for (double lr : get_lr()) line << lr << " ";
  line << "grad_norm=" << global_grad_norm_;
  if (config_.wall_clock_breakdown) {
    using ms = std::chrono::duration<double, std::milli>;
    line << std::fixed << std::setprecision(3) << " backward_ms=" << ms(backward_time_).count()
         << " step_ms=" << ms(step_time_).count();
  }
  std::cerr << line.str() << "\n";
}

}  // namespace stepwise
