// stepwise (internal): what the config parser needs of the optimizers: their names as
// the config spells them.
#pragma once

#include <stepwise/optimizers.h>

#include <string>
#include <vector>

namespace stepwise {

/// The optimizer types make_optimizer accepts, as spelled in the config.
const std::vector<std::string>& supported_optimizer_types();

}  // namespace stepwise
