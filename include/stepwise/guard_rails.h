// stepwise: the guard rails that refuse leftover calls in a training loop.
//
// Usage {.cpp .fragment context="basic"}:
//
//   // A loop whose optimizer updates through .data() on purpose keeps the other checks:
//   auto config = stepwise::Config::from_string(R"({"train_batch_size": 8,
//                                  "stepwise": {"check_params_changed": false}})");
//   stepwise::GuardRailOptions rails = config.guard_rails;  // what the engine is built with
//   bool off = !rails.check_params_changed();               // true
//
// Each check is a UsageError naming the parameter and the call to remove
// (docs/gradient-accumulation.md, pitfall 5); each can be turned off alone.
#pragma once

#include <torch/arg.h>

namespace stepwise {

/// Options of the leftover-call checks (the config's `"stepwise"` section).
struct GuardRailOptions {
  /// Refuse gradients cleared or changed between micro-steps of a window (a
  /// leftover zero_grad()).
  TORCH_ARG(bool, check_grads_cleared) = true;
  /// Refuse gradients changed between backward() and step() (a leftover
  /// clip_grad_norm_).
  TORCH_ARG(bool, check_grads_changed) = true;
  /// Refuse parameters updated outside step() (a leftover optimizer.step()).
  TORCH_ARG(bool, check_params_changed) = true;
};

}  // namespace stepwise
