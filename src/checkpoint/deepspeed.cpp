#include "checkpoint/deepspeed.h"

#include <torch/torch.h>

#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>

#include "checkpoint/files.h"
#include "torch_compat.h"

namespace stepwise::detail {

namespace {
using Dict = c10::impl::GenericDict;
// tools/deepspeed-to-stepwise's optimizer entry: (state, groups), with (index, step,
// exp_avg, exp_avg_sq) per parameter and (lr, betas, eps, weight_decay, indices) per group.
std::vector<c10::IValue> elements(const c10::IValue& tuple) {
  return tuple.toTuple()->elements().vec();  // a copy of the handles (TupleElements)
}

template <typename State, typename Options>
void apply_adam_state(torch::optim::Optimizer& optimizer, const c10::IValue& saved) {
  const auto groups = elements(elements(saved)[1]);
  std::vector<torch::Tensor> params;
  auto& mine = optimizer.param_groups();
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto g = elements(groups[i]);
    const auto betas = elements(g[1]);
    static_cast<Options&>(mine[i].options())
        .lr(g[0].toDouble())
        .betas({betas[0].toDouble(), betas[1].toDouble()})
        .eps(g[2].toDouble())
        .weight_decay(g[3].toDouble());
    for (const auto& p : mine[i].params()) params.push_back(p);
  }
  for (const auto& entry : elements(elements(saved)[0])) {
    const auto e = elements(entry);
    const auto& p = params[static_cast<size_t>(e[0].toInt())];
    auto state = std::make_unique<State>();
    state->step(e[1].toInt());
    state->exp_avg(e[2].toTensor().to(p.options()).clone());
    state->exp_avg_sq(e[3].toTensor().to(p.options()).clone());
    optimizer.state()[compat::state_key(optimizer, p)] = std::move(state);
  }
}

}  // namespace

// A converted DeepSpeed checkpoint (tools/deepspeed-to-stepwise) as stepwise's own shared
// state: a boundary checkpoint without a window.
SharedState from_deepspeed(const Dict& ds, const std::string& file, int64_t gas,
                           const std::string& precision) {
  SharedState s;
  for (const auto& pair : entry(ds, "module", file).toTuple()->elements().vec()) {
    const auto items = pair.toTuple()->elements().vec();  // (name, tensor)
    s.module.emplace_back(items[0].toStringRef(), items[1].toTensor());
  }
  s.optimizer_type = "deepspeed";
  s.deepspeed_optimizer = entry(ds, "optimizer", file);
  const auto scheduler = entry(ds, "lr_scheduler", file);
  if (!scheduler.isNone()) {
    // DeepSpeed's last_batch_iteration is k - 1 after k steps; stepwise counts k.
    const int64_t steps = scheduler.toInt() + 1;
    s.lr_scheduler = SavedScheduler{steps, steps, std::nullopt};
  }
  s.global_steps = entry(ds, "global_steps", file).toInt();
  s.global_samples = entry(ds, "global_samples", file).toInt();
  s.skipped_steps = entry(ds, "skipped_steps", file).toInt();
  s.micro_steps = s.global_steps * gas;  // DeepSpeed does not save it
  s.dp_world_size = entry(ds, "dp_world_size", file).toInt();
  s.gradient_accumulation_steps = gas;
  s.precision = precision;
  s.ds_config = entry(ds, "ds_config", file).toStringRef();
  return s;
}

// Why that Adam/AdamW state (from DeepSpeed) does not fit `optimizer`.
std::string deepspeed_optimizer_mismatch(torch::optim::Optimizer& optimizer,
                                         const c10::IValue& saved) {
  const bool adam = dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr ||
                    dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr ||
                    dynamic_cast<FusedAdamW*>(&optimizer) != nullptr;
  if (!adam) {
    return "only an Adam or AdamW state converts; this engine's optimizer is a " +
           optimizer_type(optimizer);
  }
  const auto groups = elements(elements(saved)[1]);
  const auto& mine = optimizer.param_groups();
  if (groups.size() != mine.size()) {
    return c10::str("it has ", groups.size(), " parameter groups, this optimizer ", mine.size());
  }
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto indices = elements(elements(groups[i])[4]);
    if (indices.size() != mine[i].params().size()) {
      return c10::str("its parameter group ", i, " has ", indices.size(),
                      " parameters, this optimizer's ", mine[i].params().size());
    }
    for (const auto& p : mine[i].params()) params.push_back(p);
  }
  for (const auto& entry : elements(elements(saved)[0])) {
    const auto e = elements(entry);
    const int64_t index = e[0].toInt();
    if (index < 0 || index >= static_cast<int64_t>(params.size())) {
      return c10::str("its state names parameter ", index, " of ", params.size());
    }
    const auto m = e[2].toTensor();
    if (m.sizes() != params[index].sizes()) {
      return c10::str("parameter ", index, "'s exp_avg has shape ", m.sizes(), ", the parameter ",
                      params[index].sizes());
    }
  }
  return "";
}

void apply_deepspeed_optimizer(torch::optim::Optimizer& optimizer, const c10::IValue& saved) {
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    apply_adam_state<torch::optim::AdamParamState, torch::optim::AdamOptions>(optimizer, saved);
  } else {
    apply_adam_state<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(optimizer, saved);
  }
}

}  // namespace stepwise::detail
