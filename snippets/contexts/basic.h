// Context "basic": the includes the pages' fragments use (this context's and the engine
// context's). (Not <torch/torch.h>: it doubles the compile time of a copied block.) They
// are engine.h's too, line for line, so that docs:copies precompiles them once for both
// contexts' copies (NOTE: [leading-includes PCH] in snippets/copies_test.py).
//
//   ```{.cpp .fragment #id context="basic"}
//   auto config = stepwise::Config::from_string(R"({"train_batch_size": 8})");
//   CHECK_NOTHROW(stepwise::Config::from_string("{}"));
//   ```
#pragma once

#include <stepwise/stepwise.h>
#include <torch/autograd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

struct basic_context {};
