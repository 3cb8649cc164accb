// The engine's side of a ZeRO stage 1 or 2 checkpoint: each rank's shard file, and the load of
// optimizer state parameter by parameter, from whatever sharding saved it, into whatever
// sharding loads it. see NOTE: [ZeRO shard file], NOTE: [resharding]
#include <torch/serialize.h>
#include <torch/torch.h>

#include "check.h"
#include "checkpoint/files.h"
#include "checkpoint/optimizer.h"
#include "checkpoint/protocol.h"
#include "engine_state.h"
#include "load_plan.h"
#include "torch_compat.h"
#include "zero.h"

#include <algorithm>
#include <map>

namespace stepwise {

// NOTE: [ZeRO shard file] Under ZeRO stage 1 or 2 with W > 1 each rank writes
// zero_pp_rank_<r>_mp_rank_00_optim_states.pt (DeepSpeed's name): its rank and W, the
// indices and names of the parameters it owns, their fp32 masters (fp16/bf16) as
// "fp32_master_<i>", and its optimizer's state as "optimizer" (a LibTorch archive, which
// Python's torch.jit.load reads: tools/zero-to-fp32 does). A load reads the files that
// hold its parameters (read_sources).
void Engine::State::save_shard(torch::serialize::OutputArchive& archive) const {
  const auto& owned = precision_->owned();
  archive.write("rank_and_world_size",
                torch::tensor({distributed::rank(), accumulator_.sizes().world_size}));
  archive.write("owned", torch::tensor(std::vector<int64_t>(owned.begin(), owned.end())));
  const auto names = detail::trainable_names(*model_);
  c10::List<std::string> owned_names;  // for tools/zero-to-fp32, which has no model
  for (const size_t i : owned) owned_names.push_back(names[i]);
  archive.write("owned_names", c10::IValue(owned_names));
  if (precision_->has_masters()) {
    for (size_t k = 0; k < owned.size(); ++k) {
      archive.write(c10::str("fp32_master_", owned[k]), precision_->optimizer_params()[k].detach());
    }
  }
  torch::serialize::OutputArchive optimizer(archive.compilation_unit());
  detail::save_optimizer(*optimizer_, optimizer);
  archive.write("optimizer", optimizer);
}

// NOTE: [resharding]: the optimizer files that hold this rank's parameters, and the
// parameters each holds; the masters this rank keeps, by name, from the shard files (a
// stage-0 checkpoint has them in its shared file, which weights_to_load reads). A stage-1
// save's owners follow from the model's sizes and the saved W (owners_by_size), so a rank
// reads only the files of its parameters' saving ranks: at the same W, its own.
detail::NamedTensors Engine::State::read_sources(const detail::ReadCheckpoint& c,
                                                 detail::LoadPlan& plan) const {
  STEPWISE_CHECK(!precision_->group_members().empty(), CheckpointError, c.shared_file,
                 " was saved under ZeRO stage ", c.shared.zero_stage,
                 ", and this engine's optimizer holds tensors "
                 "that are not parameters of the model, so the saved state cannot be matched "
                 "to them: build the optimizer over the model's parameters");
  const auto names = detail::trainable_names(*model_);
  const auto& owned = precision_->owned();
  if (c.shared.zero_stage == 0) {
    detail::LoadPlan::Source source;
    source.file = c.path + "/" + detail::kOptimizerFile;
    detail::read_archive(source.file, source.archive);
    for (size_t i = 0; i < names.size(); ++i) source.params.push_back(i);
    plan.sources.push_back(std::move(source));
    return {};
  }
  const int64_t world = c.shared.dp_world_size;
  std::vector<int64_t> numels;
  for (const auto& p : precision_->model_params()) numels.push_back(p.numel());
  const auto saver = detail::owners_by_size(numels, world);
  std::vector<bool> needed(static_cast<size_t>(world), false);
  for (const size_t i : owned) needed[static_cast<size_t>(saver[i])] = true;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  std::vector<bool> found(names.size(), false);
  std::map<size_t, torch::Tensor> masters;  // by trainable index
  std::string files;                        // those read, for a message
  for (int64_t r = 0; r < world; ++r) {
    if (!needed[static_cast<size_t>(r)]) continue;
    detail::LoadPlan::Source source;
    source.file = c.path + "/" + detail::zero_shard_file(r);
    files += (files.empty() ? "" : ", ") + source.file;
    detail::read_archive(source.file, source.archive);
    detail::reading(source.file, [&] {
      torch::Tensor where, saved_owned;
      c10::IValue saved_names;
      source.archive.read("rank_and_world_size", where);
      STEPWISE_CHECK(where[0].item<int64_t>() == r && where[1].item<int64_t>() == world,
                     CheckpointError, source.file, " is rank ", where[0].item<int64_t>(), " of ",
                     where[1].item<int64_t>(), "'s shard, but ", c.shared_file, " was saved by ",
                     world, " ranks: the folder mixes two saves");
      source.archive.read("owned", saved_owned);
      source.archive.read("owned_names", saved_names);
      const auto list = saved_names.toList();
      for (size_t k = 0; k < list.size(); ++k) {
        const std::string name = list.get(k).toStringRef();
        const auto it = index.find(name);
        STEPWISE_CHECK(it != index.end(), CheckpointError, source.file,
                       " holds the optimizer state of \"", name,
                       "\", which is not a trainable parameter of this model: load the "
                       "checkpoint of the same model");
        source.params.push_back(it->second);
        found[it->second] = true;
        const bool mine = std::find(owned.begin(), owned.end(), it->second) != owned.end();
        if (mine && precision_->has_masters()) {
          source.archive.read(c10::str("fp32_master_", saved_owned[k].item<int64_t>()),
                              masters[it->second]);
        }
      }
      torch::serialize::InputArchive optimizer;
      source.archive.read("optimizer", optimizer);
      source.archive = std::move(optimizer);
    });
    plan.sources.push_back(std::move(source));
  }
  for (const size_t i : owned) {
    STEPWISE_CHECK(found[i], CheckpointError, c.shared_file, " was saved by ", world,
                   " ranks under ZeRO stage ", c.shared.zero_stage,
                   ", and none of the files that hold this rank's "
                   "parameters by their sizes (",
                   files, ") holds \"", names[i],
                   "\": load the checkpoint with the model it was saved with");
  }
  detail::NamedTensors named;
  for (auto& [i, m] : masters) named.emplace_back(names[i], std::move(m));
  return named;
}

// Runs `body(stand_ins)` with the optimizer's groups holding, instead of this rank's
// parameters, an fp32 stand-in for each of `params` (indices into the trainable
// parameters), group by group as the checkpoint's optimizer held them; puts the groups
// back after, whatever happens.
void Engine::State::with_stand_ins(const std::vector<size_t>& params,
                                   const std::function<void(const detail::StandIns&)>& body) const {
  auto& groups = optimizer_->param_groups();
  std::vector<std::vector<torch::Tensor>> kept;
  for (auto& g : groups) kept.push_back(g.params());
  const auto names = detail::trainable_names(*model_);
  const auto& members = precision_->group_members();
  detail::StandIns stand_ins;
  for (size_t g = 0; g < groups.size() && g < members.size(); ++g) {
    std::vector<torch::Tensor> group;
    for (const size_t i : members[g]) {
      if (std::find(params.begin(), params.end(), i) == params.end()) continue;
      const auto& p = precision_->model_params()[i];
      auto stand_in = torch::zeros(p.sizes(), p.options().dtype(torch::kFloat));
      stand_ins.names.emplace(stand_in.unsafeGetTensorImpl(), names[i]);
      stand_ins.tensors.emplace_back(i, stand_in);
      group.push_back(stand_in);
    }
    groups[g].params() = std::move(group);
  }
  const auto put_back = [&] {
    for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = kept[g];
  };
  try {
    body(stand_ins);
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

// Loads each source into stand-ins, then hands each of this rank's parameters its state,
// keyed by the tensor this rank's optimizer steps for it (its master, or itself in fp32).
void Engine::State::install_resharded(detail::LoadPlan& plan) {
  const auto& owned = precision_->owned();
  std::map<size_t, std::unique_ptr<torch::optim::OptimizerParamState>> states;
  for (auto& source : plan.sources) {
    with_stand_ins(source.params, [&](const detail::StandIns& stand_ins) {
      optimizer_->state().clear();
      detail::load_optimizer(*optimizer_, source.archive);  // and the groups' options
      for (const auto& [i, stand_in] : stand_ins.tensors) {
        if (std::find(owned.begin(), owned.end(), i) == owned.end()) continue;
        auto it = optimizer_->state().find(compat::state_key(*optimizer_, stand_in));
        if (it != optimizer_->state().end()) states[i] = std::move(it->second);
      }
      optimizer_->state().clear();
    });
  }
  for (size_t k = 0; k < owned.size(); ++k) {
    auto it = states.find(owned[k]);
    if (it == states.end()) continue;  // never stepped when saved
    const auto& target = precision_->optimizer_params()[k];
    optimizer_->state()[compat::state_key(*optimizer_, target)] = std::move(it->second);
  }
}

}  // namespace stepwise
