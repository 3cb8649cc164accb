// Config::resolve_batch_sizes: DeepSpeed's rule that any two of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps give the third.
#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "check.h"

#include <cstdint>
#include <optional>

namespace stepwise {

BatchSizes Config::resolve_batch_sizes(int64_t world_size) const {
  STEPWISE_CHECK(world_size > 0, ConfigError, "world size must be positive, got ", world_size);
  auto check_given = [](const std::optional<int64_t>& v, const char* key) {
    STEPWISE_CHECK(!v || *v > 0, ConfigError, key, " must be a positive integer, got ", *v);
  };
  check_given(train_batch_size, "train_batch_size");
  check_given(train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu");
  check_given(gradient_accumulation_steps, "gradient_accumulation_steps");
  STEPWISE_CHECK(train_batch_size || train_micro_batch_size_per_gpu, ConfigError,
                 "neither train_batch_size nor train_micro_batch_size_per_gpu is set; set at "
                 "least one of them");
  // Each product of given sizes must fit an int64 (a fuzzed config once overflowed here).
  auto times = [](int64_t a, int64_t b) {
    int64_t product = 0;
    STEPWISE_CHECK(!__builtin_mul_overflow(a, b, &product), ConfigError,
                   "batch sizes too large: ", a, " * ", b,
                   " overflows a 64-bit integer; check train_batch_size, "
                   "train_micro_batch_size_per_gpu and gradient_accumulation_steps");
    return product;
  };
  BatchSizes out;
  out.world_size = world_size;
  const int64_t w = world_size;
  if (train_batch_size && train_micro_batch_size_per_gpu && gradient_accumulation_steps) {
    out = {*train_batch_size, *train_micro_batch_size_per_gpu, *gradient_accumulation_steps, w};
  } else if (train_batch_size && train_micro_batch_size_per_gpu) {
    out = {*train_batch_size, *train_micro_batch_size_per_gpu,
           *train_batch_size / times(*train_micro_batch_size_per_gpu, w), w};
  } else if (train_batch_size && gradient_accumulation_steps) {
    out = {*train_batch_size, *train_batch_size / times(w, *gradient_accumulation_steps),
           *gradient_accumulation_steps, w};
  } else if (train_micro_batch_size_per_gpu && gradient_accumulation_steps) {
    out = {times(times(*train_micro_batch_size_per_gpu, *gradient_accumulation_steps), w),
           *train_micro_batch_size_per_gpu, *gradient_accumulation_steps, w};
  } else if (train_batch_size) {
    out = {*train_batch_size, *train_batch_size / w, 1, w};
  } else {
    out = {times(*train_micro_batch_size_per_gpu, w), *train_micro_batch_size_per_gpu, 1, w};
  }
  const bool consistent =
      out.micro_batch > 0 && out.gradient_accumulation_steps > 0 &&
      out.train_batch_size == times(times(out.micro_batch, out.gradient_accumulation_steps), w);
  STEPWISE_CHECK(
      consistent, ConfigError, "inconsistent batch sizes: train_batch_size (", out.train_batch_size,
      ") must equal train_micro_batch_size_per_gpu (", out.micro_batch,
      ") * gradient_accumulation_steps (", out.gradient_accumulation_steps, ") * world size (", w,
      ")",
      (train_batch_size && !(train_micro_batch_size_per_gpu && gradient_accumulation_steps)
           ? " after dividing; make train_batch_size a multiple of the other two "
             "times the world size"
           : "; change one of the values so the product matches"));
  return out;
}

}  // namespace stepwise
