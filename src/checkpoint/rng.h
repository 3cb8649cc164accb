// stepwise (internal): the random generators' state, saved in each rank's window file so
// that dropout and random sampling resume exactly. see NOTE: [checkpoint layout]
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace stepwise::detail {

/// One process's generator states: the default CPU generator's and each CUDA device's
/// (none where CUDA is not available), as `Generator::get_state` returns them.
struct RngState {
  torch::Tensor cpu;
  std::vector<torch::Tensor> cuda;
};

/// This process's generator states now.
RngState capture_rng();

/// `saved` (read from `file`) fits this process's generators: the CPU state has the
/// size LibTorch's CPU generator takes, each CUDA state the size its device's takes.
/// CheckpointError naming the file, the state and LoadOptions().load_rng_state(false)
/// otherwise. A saved run with another number of CUDA devices fits: restore_rng sets
/// the devices both have, and warns.
void check_rng_fits(const RngState& saved, const std::string& file);

/// Sets this process's generators to `saved` (checked by check_rng_fits).
void restore_rng(const RngState& saved);

}  // namespace stepwise::detail
