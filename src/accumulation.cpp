#include <stepwise/accumulation.h>

#include <stepwise/errors.h>
#include "accumulator.h"
#include "check.h"

#include <limits>

namespace stepwise {

int64_t total_num_steps(int64_t micro_batches_per_epoch, int64_t epochs, int64_t gas,
                        EpochEnd epoch_end) {
  STEPWISE_CHECK(micro_batches_per_epoch > 0 && epochs > 0 && gas > 0, UsageError,
                 "total_num_steps(micro_batches_per_epoch=", micro_batches_per_epoch,
                 ", epochs=", epochs, ", gas=", gas, "): each must be positive");
  const int64_t per_epoch = (micro_batches_per_epoch + gas - 1) / gas;  // with flushes
  STEPWISE_CHECK(micro_batches_per_epoch <= std::numeric_limits<int64_t>::max() / epochs,
                 UsageError, "total_num_steps: ", micro_batches_per_epoch, " x ", epochs,
                 " micro-batches overflow a 64-bit integer");
  return epoch_end == EpochEnd::kFlush ? epochs * per_epoch
                                       : micro_batches_per_epoch * epochs / gas;
}

Accumulator::Accumulator(const BatchSizes& sizes, const AccumulationOptions& options)
    : sizes_(sizes), options_(options) {
  STEPWISE_CHECK(gas() > 0, ConfigError, "gradient_accumulation_steps must be positive, got ",
                 gas());
}

void Accumulator::on_backward(bool scaled) {
  STEPWISE_CHECK(!(options_.strict_cadence() && s_.awaiting_step && !s_.manual_boundary),
                 UsageError,
                 "engine.backward() was called twice without engine.step() in between (at "
                 "micro_steps ",
                 s_.micro_steps,
                 "): call engine.step() after every engine.backward(), also between "
                 "accumulation boundaries. The engine counts micro-batches in step(); see ",
                 kCadenceDocs,
                 ", pitfall 4. To allow this anyway set "
                 "\"stepwise\": {\"strict_cadence\": false}.");
  s_.awaiting_step = true;
  s_.window_backwards += 1;
  s_.window_scaled += scaled ? 1 : 0;
}

double Accumulator::early_end_factor() const {
  STEPWISE_CHECK(s_.window_scaled == 0 || s_.window_scaled == s_.window_backwards, UsageError,
                 "this accumulation window mixed backward() calls that divided the loss by GAS (",
                 s_.window_scaled, ") with calls that did not (",
                 s_.window_backwards - s_.window_scaled,
                 "), so its gradients have no common scale to correct: use one "
                 "BackwardOptions().scale_wrt_gas(...) value for a whole window");
  if (s_.window_scaled == 0 || s_.window_backwards == 0) return 1.0;
  return static_cast<double>(gas()) / static_cast<double>(s_.window_backwards);
}

void Accumulator::check_step() const {
  STEPWISE_CHECK(!(options_.strict_cadence() && !s_.awaiting_step), UsageError,
                 "engine.step() was called without a preceding engine.backward() (at "
                 "micro_steps ",
                 s_.micro_steps,
                 "): call engine.backward(loss) once per micro-batch, then engine.step(). "
                 "See ",
                 kCadenceDocs,
                 ". To allow this anyway set "
                 "\"stepwise\": {\"strict_cadence\": false}.");
}

void Accumulator::end_window(bool skipped, int64_t samples) {
  s_.window_backwards = s_.window_scaled = 0;
  s_.global_steps += 1;
  s_.global_samples += samples;
  if (skipped) s_.skipped_steps += 1;
}

void Accumulator::on_step() {
  s_.awaiting_step = false;
  s_.micro_steps += 1;
}

void Accumulator::on_boundary(bool skipped, int64_t samples) {
  end_window(skipped, samples);
  on_step();
}

void Accumulator::on_flush(bool skipped, int64_t samples) {
  s_.awaiting_step = false;
  const int64_t rest = gas() - pending();  // the micro-steps this window did not get
  end_window(skipped, samples);
  s_.micro_steps += rest;
}

}  // namespace stepwise
