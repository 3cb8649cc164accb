// Internal: HF's "auto" placeholders and the AutoValues fields that fill them
// (NOTE: [HF auto]).
//
// Usage (config.cpp):
//
//   const nlohmann::json filled = detail::fill_auto(json, auto_values);
//   detail::auto_field("optimizer.params.lr");  // "learning_rate"
//
#pragma once

#include <stepwise/config.h>
#include <stepwise/errors.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace stepwise::detail {

/// One key whose "auto" HF's Trainer fills, and the AutoValues field it fills it from.
struct AutoKey {
  /// JSON path, for example "optimizer.params.lr".
  const char* path;
  /// AutoValues' field, for example "learning_rate" (two for the betas).
  const char* field;
};

/// Every key HF fills that stepwise reads, in the order docs/config.md lists them.
const std::vector<AutoKey>& auto_keys();

/// `json` with every "auto" that `values` fills replaced by its value, as HF's Trainer
/// replaces them (scheduler.params.warmup_min_lr: 0, as HF fills it).
nlohmann::json fill_auto(nlohmann::json json, const AutoValues& values);

/// The AutoValues field that fills `path` ("" if none does).
std::string auto_field(const std::string& path);

/// The error for an "auto" at `path` that nothing filled: `path`, `why_not` (what else
/// could have settled it, or ""), then the AutoValues field that fills it, if one does.
ConfigError unfilled_auto(const std::string& path, const std::string& why_not);

}  // namespace stepwise::detail
