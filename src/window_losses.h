// stepwise (internal): the losses of the accumulation window, as backward() returned them,
// and of the last window that ended: what Engine::window_loss() reports and what a
// checkpoint's rank window saves of them.
#pragma once

#include <torch/types.h>

#include <utility>
#include <vector>

namespace stepwise::detail {

/// A window's loss from what backward() returned in it: the mean its gradients were (a
/// float tensor), `losses` summed and multiplied by `factor`; undefined for no losses.
inline torch::Tensor window_mean(const std::vector<torch::Tensor>& losses, double factor) {
  if (losses.empty()) return {};
  return torch::stack(losses).to(torch::kFloat).sum() * factor;
}

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
  torch::Tensor last_loss() const { return window_mean(last, last_factor); }
};

}  // namespace stepwise::detail
