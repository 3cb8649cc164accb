// Engine's public methods: the engine is its State (engine_state.h) behind one pointer, and
// the API forwards to it.
#include <stepwise/engine.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "engine_state.h"

namespace stepwise {

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config,
               std::unique_ptr<torch::optim::Optimizer> client_optimizer,
               std::unique_ptr<torch::optim::LRScheduler> client_scheduler)
    : state_(std::make_unique<State>(std::move(model), std::move(config),
                                     std::move(client_optimizer), std::move(client_scheduler))) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;

torch::Tensor Engine::backward(const torch::Tensor& loss, const BackwardOptions& options) {
  return state_->backward(loss, options);
}
void Engine::step() { state_->step(); }
bool Engine::flush() { return state_->flush(); }
void Engine::set_gradient_accumulation_boundary(bool is_boundary) {
  state_->set_gradient_accumulation_boundary(is_boundary);
}
void Engine::clear_gradient_accumulation_boundary() {
  state_->clear_gradient_accumulation_boundary();
}
std::string Engine::save_checkpoint(const std::string& dir, const SaveOptions& options) {
  return state_->save_checkpoint(dir, options);
}
LoadedCheckpoint Engine::load_checkpoint(const std::string& dir, const LoadOptions& options) {
  return state_->load_checkpoint(dir, options);
}
bool Engine::is_gradient_accumulation_boundary() const {
  return state_->accumulator_.is_boundary();
}
int64_t Engine::global_steps() const { return state_->accumulator_.global_steps(); }
int64_t Engine::micro_steps() const { return state_->accumulator_.micro_steps(); }
int64_t Engine::skipped_steps() const { return state_->accumulator_.skipped_steps(); }
int64_t Engine::global_samples() const { return state_->accumulator_.global_samples(); }
bool Engine::was_step_applied() const { return state_->was_step_applied_; }
torch::Tensor Engine::window_loss() const { return state_->window_loss(); }
std::vector<double> Engine::get_lr() const { return state_->get_lr(); }
double Engine::global_grad_norm() const { return state_->global_grad_norm_; }
double Engine::loss_scale() const { return state_->precision_->loss_scale(); }
const std::vector<torch::Tensor>& Engine::master_params() const {
  return state_->precision_->optimizer_params();
}
const BatchSizes& Engine::batch_sizes() const { return state_->accumulator_.sizes(); }
int64_t Engine::train_batch_size() const { return state_->accumulator_.sizes().train_batch_size; }
int64_t Engine::train_micro_batch_size_per_gpu() const {
  return state_->accumulator_.sizes().micro_batch;
}
int64_t Engine::gradient_accumulation_steps() const { return state_->accumulator_.gas(); }
torch::optim::Optimizer& Engine::optimizer() { return *state_->optimizer_; }
torch::optim::LRScheduler* Engine::lr_scheduler() { return state_->scheduler_.get(); }
torch::nn::Module& Engine::module() { return *state_->model_; }
const Config& Engine::config() const { return state_->config_; }
const distributed::GradientReducer& Engine::gradient_reducer() const { return *state_->reducer_; }

}  // namespace stepwise
