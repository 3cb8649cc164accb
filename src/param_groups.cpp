#include "param_groups.h"

#include <stepwise/errors.h>

#include "check.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <string>

namespace stepwise {

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// A normalization module by its class: the name without namespace and "Impl" ends in
// "Norm" (LayerNorm, GroupNorm, RMSNorm) or "Norm1d".."Norm3d" (BatchNorm, InstanceNorm).
bool norm_class(const std::string& type_name) {
  std::string name =
      type_name.substr(type_name.rfind(':') == std::string::npos ? 0 : type_name.rfind(':') + 1);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0)
    name.resize(name.size() - 4);
  static const std::regex norm(".*norm([123]d)?$");
  return std::regex_match(lower(name), norm);
}

// A normalization module by its name in its parent, as transformers' Trainer matches:
// "norm", "..._norm", or one containing "layernorm" or "rmsnorm".
bool norm_name(const std::string& attribute) {
  const std::string name = lower(attribute);
  return name == "norm" || (name.size() > 5 && name.compare(name.size() - 5, 5, "_norm") == 0) ||
         name.find("layernorm") != std::string::npos || name.find("rmsnorm") != std::string::npos;
}

// Adds `module`'s own parameters (not its children's) to the groups, then its children's.
void split(const torch::nn::Module& module, bool named_norm, ParamGroup& decay,
           ParamGroup& no_decay) {
  const bool norm = named_norm || norm_class(module.name());
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (!item.value().requires_grad()) continue;
    (norm || item.key() == "bias" ? no_decay : decay).params.push_back(item.value());
  }
  for (const auto& child : module.named_children()) {
    split(*child.value(), norm_name(child.key()), decay, no_decay);
  }
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(const torch::nn::Module& model) {
  ParamGroup decay, no_decay;
  no_decay.weight_decay(0.0);
  split(model, false, decay, no_decay);
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

namespace detail {

void check_param_groups(const torch::nn::Module& model, const std::vector<ParamGroup>& groups) {
  std::map<const c10::TensorImpl*, std::string> names;  // the model's parameters
  for (const auto& item : model.named_parameters()) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::map<const c10::TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const torch::Tensor& p = groups[g].params[i];
      const auto name = names.find(p.defined() ? p.unsafeGetTensorImpl() : nullptr);
      STEPWISE_CHECK(name != names.end(), ConfigError, "parameter group ", g, " holds a tensor (",
                     i,
                     " in the group) that is not a parameter of the model: build the groups "
                     "from model->named_parameters() or model->parameters()");
      STEPWISE_CHECK(p.requires_grad(), ConfigError, "parameter group ", g, " holds \"",
                     name->second,
                     "\", which does not require grad: leave frozen parameters out of the groups");
      const auto [seen, fresh] = group_of.emplace(p.unsafeGetTensorImpl(), g);
      STEPWISE_CHECK(fresh, ConfigError, "\"", name->second, "\" is in parameter group ",
                     seen->second, " and in group ", g, ": put each parameter in one group");
    }
  }
  for (const auto& item : model.named_parameters()) {
    STEPWISE_CHECK(
        !item.value().requires_grad() || group_of.count(item.value().unsafeGetTensorImpl()) > 0,
        ConfigError, "\"", item.key(),
        "\" requires grad but is in no parameter group, so it would never be "
        "updated: add it to a group, or freeze it with requires_grad(false)");
  }
}

}  // namespace detail

}  // namespace stepwise
