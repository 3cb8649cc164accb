// stepwise (internal): what an engine's load applies, worked out and checked before it
// changes anything (src/engine_checkpoint.cpp), and the stand-ins through which a ZeRO
// checkpoint's optimizer state is read parameter by parameter (src/engine_resharding.cpp).
#pragma once

#include <c10/core/TensorImpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/types.h>

#include "accumulator.h"
#include "checkpoint/load_checks.h"
#include "checkpoint/rng.h"

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stepwise::detail {

struct LoadPlan {
  Copies copies;
  std::vector<torch::Tensor> window_grads;  // by trainable index; undefined: none
  bool load_optimizer = false;
  // Neither this engine nor the checkpoint is sharded: the optimizer file's archive.
  torch::serialize::InputArchive optimizer_archive;
  // NOTE: [resharding]: the optimizer files that hold this rank's parameters, and whose
  // state each holds.
  struct Source {
    std::string file;
    torch::serialize::InputArchive archive;
    std::vector<size_t> params;  // indices of the trainable parameters, in model order
  };
  bool reshard = false;
  std::vector<Source> sources;
  bool load_deepspeed_optimizer = false;
  bool load_scheduler = false;
  bool load_scaler = false;
  AccumulatorState counters;
  std::optional<RngState> rng;
};

/// The fp32 tensors an optimizer's groups hold instead of this rank's parameters while a
/// source's state is read (Engine::State::with_stand_ins).
struct StandIns {
  std::vector<std::pair<size_t, torch::Tensor>> tensors;  // (trainable index, stand-in)
  std::map<const c10::TensorImpl*, std::string> names;    // a stand-in's parameter name
  /// The name of the parameter `t` stands in for.
  std::string name_of(const torch::Tensor& t) const {
    const auto it = names.find(t.unsafeGetTensorImpl());
    return it != names.end() ? it->second : std::string("(not a parameter of the model)");
  }
};

}  // namespace stepwise::detail
