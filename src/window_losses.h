// stepwise (internal): the losses of the accumulation window, as backward() returned them,
// and of the last window that ended: what Engine::window_loss() reports and what a
// checkpoint's rank window saves of them.
#pragma once

#include <torch/types.h>

#include <utility>
#include <vector>

namespace stepwise::detail {

/// This window's losses and the last finished window's, with that window's mean factor.
struct WindowLosses {
  /// What backward() returned in the window in progress (already divided by GAS).
  std::vector<torch::Tensor> current;
  /// ... and in the last window that ended.
  std::vector<torch::Tensor> last;
  /// What the last window's gradients were multiplied by to make them a mean (GAS / k
  /// for a window cut short after k micro-batches; 1 for a whole one).
  double last_factor = 1.0;

  /// Records one backward()'s loss.
  void add(torch::Tensor loss) { current.push_back(std::move(loss)); }
  /// The window ends with its gradients multiplied by `factor`: its losses become the last.
  void end_window(double factor) {
    last.swap(current);
    current.clear();
    last_factor = factor;
  }
  /// The last window's loss, as the mean its gradients were (a float tensor), or undefined
  /// before the first window ends.
  torch::Tensor last_loss() const {
    if (last.empty()) return {};
    return torch::stack(last).to(torch::kFloat).sum() * last_factor;
  }
};

}  // namespace stepwise::detail
