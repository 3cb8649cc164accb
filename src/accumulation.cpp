#include <stepwise/accumulation.h>
#include <stepwise/errors.h>

namespace stepwise {

Accumulator::Accumulator(int64_t gas, bool strict_cadence)
    : gas_(gas), strict_cadence_(strict_cadence) {
  STEPWISE_CHECK(gas > 0, ConfigError, "gradient_accumulation_steps must be positive, got ", gas);
}

void Accumulator::on_backward() {
  STEPWISE_CHECK(!(strict_cadence_ && awaiting_step_), UsageError,
                 "engine.backward() was called twice without engine.step() in between (at "
                 "micro_steps ",
                 micro_steps_,
                 "): call engine.step() after every engine.backward(), also between "
                 "accumulation boundaries. The engine counts micro-batches in step(); see ",
                 kCadenceDocs,
                 ", pitfall 4. To allow this anyway set "
                 "\"stepwise\": {\"strict_cadence\": false}.");
  awaiting_step_ = true;
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
    global_steps_ += 1;
    global_samples_ += samples;
    if (skipped) skipped_steps_ += 1;
  }
  micro_steps_ += 1;
}

void Accumulator::on_flush(bool skipped, int64_t samples) {
  awaiting_step_ = false;
  global_steps_ += 1;
  global_samples_ += samples;
  if (skipped) skipped_steps_ += 1;
  micro_steps_ += gas_ - pending();
}

}  // namespace stepwise
