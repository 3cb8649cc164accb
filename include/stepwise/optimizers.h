// stepwise: optimizers from the config's "optimizer" section.
//
// Usage:
//
//   stepwise::OptimizerConfig opt;
//   opt.type = "Adam";  // decoupled weight decay unless adam_w_mode = false
//   opt.lr = 1e-3;
//   auto optimizer = stepwise::make_optimizer(opt, model->parameters());
//
// Built on LibTorch's own optimizers: "Adam" -> torch::optim::AdamW (or
// torch::optim::Adam with adam_w_mode = false), "AdamW" -> AdamW,
// "SGD" -> torch::optim::SGD. see NOTE: [Adam means AdamW]
#pragma once

#include <stepwise/config.h>

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace stepwise {

/// The optimizer types make_optimizer accepts, as spelled in the config.
const std::vector<std::string>& supported_optimizer_types();

/// Builds the optimizer `config` describes over `params`. Throws ConfigError
/// for an unknown type.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<torch::Tensor> params);

/// Builds the schedule `config` describes, driving `optimizer`.
std::unique_ptr<Schedule> make_scheduler(const SchedulerConfig& config,
                                         torch::optim::Optimizer& optimizer);

}  // namespace stepwise
