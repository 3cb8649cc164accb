// stepwise (internal): a callback for each parameter once autograd has accumulated its
// gradient, what both gradient reducers start their communication from.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace stepwise::detail {

/// Calls `on_ready(k)` after each backward has accumulated `params[k]`'s gradient into
/// `.grad` (a post hook on its AccumulateGrad node; a parameter that is not a leaf gets
/// none). The hooks live in the autograd graph's nodes and may outlive this object: after
/// its destruction they do nothing.
class ReadyHooks {
 public:
  ReadyHooks(const std::vector<torch::Tensor>& params, std::function<void(size_t)> on_ready);
  ~ReadyHooks();
  ReadyHooks(const ReadyHooks&) = delete;
  ReadyHooks& operator=(const ReadyHooks&) = delete;

  struct Target;

 private:
  std::shared_ptr<Target> target_;
  std::vector<std::shared_ptr<torch::autograd::Node>> nodes_;
};

}  // namespace stepwise::detail
