// Context "basic": the includes the pages' fragments use, nothing else. (Not
// <torch/torch.h>: it doubles the compile time of a copied block.)
//
//   ```{.cpp .fragment #id context="basic"}
//   auto config = stepwise::Config::from_string(R"({"train_batch_size": 8})");
//   CHECK_NOTHROW(stepwise::Config::from_string("{}"));
//   ```
#pragma once

#include <stepwise/stepwise.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
