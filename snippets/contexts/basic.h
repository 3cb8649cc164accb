// Context "basic": the includes every page needs, nothing else.
//
//   ```{.cpp .fragment #id context="basic"}
//   auto config = stepwise::Config::from_string(R"({"train_batch_size": 8})");
//   CHECK_NOTHROW(stepwise::Config::from_string("{}"));
//   ```
#pragma once

#include <stepwise/stepwise.h>
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

struct basic_context {};
