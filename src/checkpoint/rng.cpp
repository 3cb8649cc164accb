#include "checkpoint/rng.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>

#include <stepwise/errors.h>

#include "check.h"

#include <algorithm>
#include <mutex>

namespace stepwise::detail {

namespace {

size_t cuda_devices() { return at::hasCUDA() ? at::getNumGPUs() : 0; }

at::Generator generator(c10::Device device) { return at::globalContext().defaultGenerator(device); }

c10::Device cuda(size_t i) { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)); }

torch::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());  // LibTorch's rule for its generators
  return gen.get_state();
}

void check_state(const torch::Tensor& saved, const torch::Tensor& now, const std::string& what,
                 const std::string& file) {
  STEPWISE_CHECK(
      saved.defined() && saved.scalar_type() == now.scalar_type() && saved.dim() == 1 &&
          saved.numel() == now.numel(),
      CheckpointError, "checkpoint file ", file, " holds a ", what, " RNG state of ",
      saved.defined() ? c10::str(saved.scalar_type(), " ", saved.sizes()) : std::string("nothing"),
      "; this LibTorch's generator takes ", now.scalar_type(), " [", now.numel(),
      "]: the file was saved by another LibTorch or is damaged. Pass "
      "LoadOptions().load_rng_state(false) to keep this process's generators");
}

}  // namespace

RngState capture_rng() {
  RngState out;
  out.cpu = state_of(generator(c10::kCPU));
  for (size_t i = 0; i < cuda_devices(); ++i) out.cuda.push_back(state_of(generator(cuda(i))));
  return out;
}

void check_rng_fits(const RngState& saved, const std::string& file) {
  check_state(saved.cpu, state_of(generator(c10::kCPU)), "CPU", file);
  const size_t both = std::min(saved.cuda.size(), cuda_devices());
  for (size_t i = 0; i < both; ++i) {
    check_state(saved.cuda[i], state_of(generator(cuda(i))), c10::str("cuda:", i), file);
  }
}

void restore_rng(const RngState& saved) {
  auto set = [](at::Generator gen, const torch::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  };
  set(generator(c10::kCPU), saved.cpu);
  const size_t devices = cuda_devices();
  for (size_t i = 0; i < std::min(saved.cuda.size(), devices); ++i)
    set(generator(cuda(i)), saved.cuda[i]);
  if (saved.cuda.size() != devices) {
    TORCH_WARN("the checkpoint holds the RNG state of ", saved.cuda.size(),
               " CUDA device(s) and this process has ", devices, ": the generators of the ",
               std::min(saved.cuda.size(), devices),
               " device(s) both have are restored, the others keep their state, so random "
               "numbers drawn on them differ from the saved run's");
  }
}

}  // namespace stepwise::detail
