#include "ready_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>

namespace stepwise::detail {

// What the hooks call through; cleared (under the mutex) when the ReadyHooks goes.
struct ReadyHooks::Target {
  std::mutex mutex;
  std::function<void(size_t)> on_ready;
};

namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::shared_ptr<ReadyHooks::Target> target, size_t index)
      : target_(std::move(target)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    std::function<void(size_t)> on_ready;
    {
      std::lock_guard<std::mutex> lock(target_->mutex);
      on_ready = target_->on_ready;
    }
    if (on_ready) on_ready(index_);
    return outputs;
  }

 private:
  std::shared_ptr<ReadyHooks::Target> target_;
  size_t index_;
};

}  // namespace

ReadyHooks::ReadyHooks(const std::vector<torch::Tensor>& params,
                       std::function<void(size_t)> on_ready)
    : target_(std::make_shared<Target>()) {
  target_->on_ready = std::move(on_ready);
  for (size_t k = 0; k < params.size(); ++k) {
    auto node = torch::autograd::impl::grad_accumulator(params[k]);
    if (!node) continue;
    node->add_post_hook(std::make_unique<ReadyHook>(target_, k));
    nodes_.push_back(std::move(node));
  }
}

ReadyHooks::~ReadyHooks() {
  std::lock_guard<std::mutex> lock(target_->mutex);
  target_->on_ready = nullptr;
}

}  // namespace stepwise::detail
