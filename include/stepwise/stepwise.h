// stepwise: everything, in one include.
//
// Usage {.cpp .fragment context="loader"}:
//
//   // #include <stepwise/stepwise.h>: every public header of stepwise
//   auto engine = stepwise::initialize(model, stepwise::Config::from_file("ds_config.json"));
#pragma once

#include <stepwise/accumulation.h>
#include <stepwise/checkpoint.h>
#include <stepwise/clip.h>
#include <stepwise/config.h>
#include <stepwise/distributed.h>
#include <stepwise/engine.h>
#include <stepwise/errors.h>
#include <stepwise/fused_adamw.h>
#include <stepwise/gradient_reducer.h>
#include <stepwise/guard_rails.h>
#include <stepwise/loss_scaler.h>
#include <stepwise/lr_schedules.h>
#include <stepwise/monitor.h>
#include <stepwise/optimizers.h>
#include <stepwise/precision.h>
#include <stepwise/zero.h>
