// Internal: DeepSpeed's features that stepwise does not implement, read by DeepSpeed's
// own rules (NOTE: [off means off]).
//
// Usage (config.cpp):
//
//   detail::read_features(fp16_reader, "fp16", config.notes);  // claims the keys
//
#pragma once

#include <string>
#include <vector>

namespace stepwise::detail {

class ObjectReader;

/// What stepwise does with a DeepSpeed feature it does not implement, when it is on.
enum class WhenOn {
  kNote,    // accepted, with one note: it does not change the numbers
  kRefuse,  // a ConfigError: it would change the numbers
};

/// One DeepSpeed key that no component reads.
struct DeepSpeedFeature {
  /// The key, in the object it is read from.
  const char* key;
  /// What leaves it off: "enabled" (an object whose "enabled" is false or absent),
  /// "never" (present means on), or a JSON value (DeepSpeed's default) it must equal.
  const char* off;
  /// What happens when it is on.
  WhenOn when_on;
  /// Why: the note, or the refusal's reason and fix.
  const char* why;
};

/// The features read in `section`: "" (the top level), "fp16", "bf16", "checkpoint",
/// "optimizer.params", "scheduler.params" or "scheduler.params (OneCycle)".
const std::vector<DeepSpeedFeature>& deepspeed_features(const std::string& section = "");

/// Claims `feature.key` if `reader`'s object has it: off, it is accepted silently; on,
/// it adds a note to `notes` or a ConfigError (to reader's problems, or thrown).
void read_feature(ObjectReader& reader, const DeepSpeedFeature& feature,
                  std::vector<std::string>& notes);

/// read_feature for every feature of `section` (see deepspeed_features).
void read_features(ObjectReader& reader, const std::string& section,
                   std::vector<std::string>& notes);

/// The keys DeepSpeed's zero_optimization section accepts (DeepSpeedZeroConfig's fields
/// and aliases), all of which have no effect at stage 0.
const std::vector<std::string>& deepspeed_zero_keys();

}  // namespace stepwise::detail
