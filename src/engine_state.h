// stepwise (internal): what an Engine holds and does. engine.h shows the API; the engine's
// parts (the reducer, the precision, the optimizer, the accumulator, the guard rails) and
// its checkpoint internals live here, behind Engine's one pointer.
#pragma once

#include <stepwise/engine.h>
#include "gradient_reducer.h"

#include "accumulator.h"
#include "monitor.h"
#include "precision_policy.h"
#include "window_losses.h"

#include <torch/serialize/output-archive.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stepwise {

namespace detail {
class LeftoverChecks;
struct LoadPlan;
struct ModelTensors;
struct ReadCheckpoint;
struct RankWindow;
struct SavedScheduler;
struct SharedState;
struct StandIns;
class ZeroShards;
}  // namespace detail

struct Engine::State {
  State(std::shared_ptr<torch::nn::Module> model, Config config,
        std::unique_ptr<torch::optim::Optimizer> client_optimizer,
        std::unique_ptr<torch::optim::LRScheduler> client_scheduler);
  ~State();

  // The API of Engine (engine.h says what each does).
  torch::Tensor backward(const torch::Tensor& loss, const BackwardOptions& options);
  void step();
  bool flush();
  void set_gradient_accumulation_boundary(bool is_boundary);
  void clear_gradient_accumulation_boundary();
  std::string save_checkpoint(const std::string& dir, const SaveOptions& options);
  LoadedCheckpoint load_checkpoint(const std::string& dir, const LoadOptions& options);
  torch::Tensor window_loss() const;
  std::vector<double> get_lr() const;

  // The parts of a step.
  void boundary_step(int64_t samples, double grad_factor, bool ends_early);
  void check_before_step(bool boundary);
  void check_scheduler_not_stepped_elsewhere() const;
  void print_progress(const std::string& line) const;

  // The engine's side of a checkpoint (src/checkpoint/ runs the save and the load):
  // what it saves, how a read checkpoint fits it (before anything changes), and the apply.
  detail::SharedState shared_state(const ClientState& client_state) const;
  detail::RankWindow rank_window() const;
  void plan_load(const detail::ReadCheckpoint& c, const LoadOptions& options,
                 detail::LoadPlan& plan) const;
  AccumulatorState counters_after_load(const detail::ReadCheckpoint& c) const;
  void plan_optimizer_load(const detail::ReadCheckpoint& c, const detail::ModelTensors& model,
                           detail::LoadPlan& plan) const;
  void apply_load(const detail::ReadCheckpoint& c, detail::LoadPlan& plan);
  void save_shard(torch::serialize::OutputArchive& archive) const;
  std::vector<std::pair<std::string, torch::Tensor>> read_sources(const detail::ReadCheckpoint& c,
                                                                  detail::LoadPlan& plan) const;
  void with_stand_ins(const std::vector<size_t>& params,
                      const std::function<void(const detail::StandIns&)>& body) const;
  void install_resharded(detail::LoadPlan& plan);
  void restore_scheduler(const detail::SavedScheduler& saved);

  std::shared_ptr<torch::nn::Module> model_;
  Config config_;
  // Built in the constructor's body, in the order of NOTE: [construction order].
  std::unique_ptr<distributed::GradientReducer> reducer_;
  std::unique_ptr<Precision> precision_;
  std::unique_ptr<detail::ZeroShards> zero_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  TakesGradScale* folds_ = nullptr;  // optimizer_, when it takes the grad scale as a value
  std::unique_ptr<torch::optim::LRScheduler> scheduler_;
  int64_t scheduler_steps_at_start_ = 0;
  int64_t scheduler_steps_taken_ = 0;
  Accumulator accumulator_;
  std::unique_ptr<detail::LeftoverChecks> leftover_checks_;
  detail::WindowLosses window_losses_;
  bool was_step_applied_ = false;
  double global_grad_norm_ = 0.0;
  std::chrono::steady_clock::duration backward_time_{};
  std::chrono::steady_clock::duration step_time_{};
  std::unique_ptr<detail::Monitor> monitor_;
};

}  // namespace stepwise
