// stepwise (internal): what initialize checks of the parameter groups it is given.
#pragma once

#include <stepwise/optimizers.h>

#include <vector>

namespace stepwise::detail {

/// Every parameter of `model` that requires grad is in exactly one of `groups`, and the
/// groups hold nothing else. ConfigError naming the parameter and the group otherwise.
void check_param_groups(const torch::nn::Module& model, const std::vector<ParamGroup>& groups);

}  // namespace stepwise::detail
