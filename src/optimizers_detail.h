// stepwise (internal): what the config parser needs of the optimizers (their names as the
// config spells them), and what stepwise's own optimizers share.
#pragma once

#include <stepwise/optimizers.h>

#include <torch/optim/adamw.h>

#include <string>
#include <vector>

namespace stepwise {

/// The optimizer types make_optimizer accepts, as spelled in the config.
const std::vector<std::string>& supported_optimizer_types();

namespace detail {

/// `p`'s state in `optimizer` (step, exp_avg, exp_avg_sq: LibTorch's AdamW state, which
/// FusedAdamW and Lamb keep), made the first time with contiguous zero moments.
torch::optim::AdamWParamState& adam_state(torch::optim::Optimizer& optimizer,
                                          const torch::Tensor& p);

}  // namespace detail

}  // namespace stepwise
