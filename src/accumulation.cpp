#include <stepwise/accumulation.h>
#include <stepwise/errors.h>

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

Accumulator::Accumulator(int64_t gas, bool strict_cadence)
    : gas_(gas), strict_cadence_(strict_cadence) {
  STEPWISE_CHECK(gas > 0, ConfigError, "gradient_accumulation_steps must be positive, got ", gas);
}

void Accumulator::on_backward(bool scaled) {
  STEPWISE_CHECK(!(strict_cadence_ && awaiting_step_ && !manual_boundary_), UsageError,
                 "engine.backward() was called twice without engine.step() in between (at "
                 "micro_steps ",
                 micro_steps_,
                 "): call engine.step() after every engine.backward(), also between "
                 "accumulation boundaries. The engine counts micro-batches in step(); see ",
                 kCadenceDocs,
                 ", pitfall 4. To allow this anyway set "
                 "\"stepwise\": {\"strict_cadence\": false}.");
  awaiting_step_ = true;
  window_backwards_ += 1;
  window_scaled_ += scaled ? 1 : 0;
}

double Accumulator::early_end_factor() const {
  STEPWISE_CHECK(window_scaled_ == 0 || window_scaled_ == window_backwards_, UsageError,
                 "this accumulation window mixed backward() calls that divided the loss by GAS (",
                 window_scaled_, ") with calls that did not (", window_backwards_ - window_scaled_,
                 "), so its gradients have no common scale to correct: use one "
                 "BackwardOptions().scale_wrt_gas(...) value for a whole window");
  if (window_scaled_ == 0 || window_backwards_ == 0) return 1.0;
  return static_cast<double>(gas_) / static_cast<double>(window_backwards_);
}

void Accumulator::check_step() const {
  STEPWISE_CHECK(!(strict_cadence_ && !awaiting_step_), UsageError,
                 "engine.step() was called without a preceding engine.backward() (at "
                 "micro_steps ",
                 micro_steps_,
                 "): call engine.backward(loss) once per micro-batch, then engine.step(). "
                 "See ",
                 kCadenceDocs,
                 ". To allow this anyway set "
                 "\"stepwise\": {\"strict_cadence\": false}.");
}

void Accumulator::on_step(bool boundary, bool skipped, int64_t samples) {
  awaiting_step_ = false;
  if (boundary) {
    window_backwards_ = window_scaled_ = 0;
    global_steps_ += 1;
    global_samples_ += samples;
    if (skipped) skipped_steps_ += 1;
  }
  micro_steps_ += 1;
}

AccumulatorState Accumulator::state() const {
  AccumulatorState s;
  s.micro_steps = micro_steps_;
  s.global_steps = global_steps_;
  s.skipped_steps = skipped_steps_;
  s.global_samples = global_samples_;
  s.window_backwards = window_backwards_;
  s.window_scaled = window_scaled_;
  s.awaiting_step = awaiting_step_;
  s.manual_boundary = manual_boundary_;
  return s;
}

void Accumulator::restore(const AccumulatorState& s) {
  micro_steps_ = s.micro_steps;
  global_steps_ = s.global_steps;
  skipped_steps_ = s.skipped_steps;
  global_samples_ = s.global_samples;
  window_backwards_ = s.window_backwards;
  window_scaled_ = s.window_scaled;
  awaiting_step_ = s.awaiting_step;
  manual_boundary_ = s.manual_boundary;
}

void Accumulator::on_flush(bool skipped, int64_t samples) {
  awaiting_step_ = false;
  window_backwards_ = window_scaled_ = 0;
  global_steps_ += 1;
  global_samples_ += samples;
  if (skipped) skipped_steps_ += 1;
  micro_steps_ += gas_ - pending();
}

}  // namespace stepwise
