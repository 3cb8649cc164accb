#include "deepspeed_features.h"

#include <stepwise/config.h>
#include <stepwise/errors.h>

#include "json_reader.h"

#include <nlohmann/json.hpp>

#include <c10/util/StringUtil.h>

#include <cstring>
#include <map>

namespace stepwise::detail {

// NOTE: [off means off] DeepSpeed reads each of these keys with a default, so a file
// that sets one to its default, or a section with "enabled": false, asks for nothing:
// it is accepted without a word. Turned on, a feature that does not change the numbers
// (logging, profiling, launcher and I/O machinery) is accepted with one note that says
// it has no effect here; one that would change the numbers is refused by name. The
// defaults are DeepSpeed's (deepspeed/runtime/constants.py and the sections' config
// classes, at edaa72212).
constexpr const char* kNoLossScale =
    "bf16 needs no loss scale, and DeepSpeed does not read it there";

const std::vector<DeepSpeedFeature>& deepspeed_features(const std::string& section) {
  static const std::map<std::string, std::vector<DeepSpeedFeature>> sections = {
      {"",
       {
           // Accepted with a note: they observe or arrange, and leave the numbers alone.
           {"activation_checkpointing", "never", WhenOn::kNote,
            "DeepSpeed recomputes activations only where the model calls "
            "deepspeed.checkpointing.checkpoint(); a LibTorch model does its own recomputation"},
           {"aio", "never", WhenOn::kNote,
            "it configures NVMe offload's I/O, and stepwise has no NVMe offload"},
           {"comms_logger", "enabled", WhenOn::kNote,
            "stepwise does not log its collectives; the progress line shows the all-reduce time "
            "with wall_clock_breakdown"},
           {"flops_profiler", "enabled", WhenOn::kNote, "stepwise has no FLOPs profiler"},
           {"tensorboard", "enabled", WhenOn::kNote,
            "stepwise writes no TensorBoard events; \"csv_monitor\" writes the same events "
            "(train_loss, lr, loss_scale) as CSV files"},
           {"wandb", "enabled", WhenOn::kNote,
            "stepwise does not report to Weights & Biases; \"csv_monitor\" writes the same "
            "events (train_loss, lr, loss_scale) as CSV files"},
           {"autotuning", "enabled", WhenOn::kNote,
            "autotuning is run by DeepSpeed's launcher, which stepwise does not have"},
           {"eigenvalue", "enabled", WhenOn::kNote,
            "it only feeds progressive layer drop and quantization, which stepwise refuses"},
           {"compile", "enabled", WhenOn::kNote, "LibTorch has no torch.compile"},
           {"memory_breakdown", "false", WhenOn::kNote, "stepwise prints no memory breakdown"},
           {"dump_state", "false", WhenOn::kNote, "stepwise does not print its state at start"},
           {"dataloader_drop_last", "false", WhenOn::kNote,
            "stepwise builds no data loader; drop the last partial batch in your own"},
           {"zero_allow_untested_optimizer", "false", WhenOn::kNote,
            "stepwise's ZeRO stages 1 and 2 shard whole tensors, so an optimizer runs sharded as "
            "it runs unsharded (Lamb, which DeepSpeed steps on flat partitions, is refused at "
            "those stages)"},
           {"disable_allgather", "false", WhenOn::kNote,
            "stepwise's ZeRO stages 1 and 2 always send the updated parameters by broadcast from "
            "each "
            "owner, which is what it asks for"},
           // Refused: each would change the numbers, and stepwise does not implement it.
           {"amp", "enabled", WhenOn::kRefuse,
            "Apex AMP is not implemented; use \"fp16\" or \"bf16\" instead"},
           {"torch_autocast", "enabled", WhenOn::kRefuse,
            "autocast is not implemented; use \"bf16\" or \"fp16\" (the whole model in that type)"},
           {"fp32_allreduce", "false", WhenOn::kRefuse,
            "all-reducing half or bf16 gradients in fp32 is not implemented; set it to false"},
           {"communication_data_type", "null", WhenOn::kRefuse,
            "all-reducing in another type than the gradients' is not implemented; remove it"},
           {"data_types", "{\"grad_accum_dtype\": null}", WhenOn::kRefuse,
            "accumulating gradients in another type than the model's is not implemented; "
            "remove it"},
           {"sparse_gradients", "false", WhenOn::kRefuse,
            "sparse embedding gradients are not implemented; set it to false"},
           {"elasticity", "enabled", WhenOn::kRefuse,
            "elastic training (batch sizes chosen by the world size) is not implemented; set the "
            "batch sizes in the file"},
           {"progressive_layer_drop", "enabled", WhenOn::kRefuse,
            "progressive layer drop is not implemented"},
           {"curriculum_learning", "enabled", WhenOn::kRefuse,
            "curriculum learning is not implemented; order or truncate the data in your loader"},
           {"data_efficiency", "enabled", WhenOn::kRefuse,
            "data efficiency (curriculum, random-LTD) is not implemented"},
           {"compression_training", "never", WhenOn::kRefuse,
            "compression training is not implemented"},
           {"quantize_training", "enabled", WhenOn::kRefuse,
            "quantized training is not implemented"},
           {"sparse_attention", "never", WhenOn::kRefuse, "sparse attention is not implemented"},
           {"pipeline", "never", WhenOn::kRefuse, "pipeline parallelism is not implemented"},
           {"hybrid_engine", "enabled", WhenOn::kRefuse, "the hybrid engine is not implemented"},
           {"seq_parallel_size", "1", WhenOn::kRefuse, "sequence parallelism is not implemented"},
           {"tensor_parallel", "never", WhenOn::kRefuse, "tensor parallelism is not implemented"},
           {"seq_parallel_communication_data_type", "\"fp32\"", WhenOn::kNote,
            "stepwise has no sequence parallelism, so nothing is communicated in that type"},
       }},
      {"optimizer.params",
       {// DeepSpeed's own refusal (engine.py, _configure_basic_optimizer), in its words.
        {"max_grad_norm", "never", WhenOn::kRefuse,
         "it is not supported as an optimizer parameter, as in DeepSpeed: use the top-level "
         "\"gradient_clipping\" instead"}}},
      {"scheduler.params",
       {{"last_batch_iteration", "-1", WhenOn::kRefuse,
         "starting a schedule part-way is not implemented: resume from a checkpoint instead, "
         "which restores the schedule's step"}}},
      {"scheduler.params (OneCycle)",
       {{"cycle_first_stair_count", "never", WhenOn::kNote,
         "DeepSpeed's OneCycle documents it but never reads it"},
        {"cycle_second_stair_count", "never", WhenOn::kNote,
         "DeepSpeed's OneCycle documents it but never reads it"}}},
      {"fp16",
       {// DeepSpeed casts in its engine's forward(), which stepwise does not have.
        {"auto_cast", "false", WhenOn::kNote,
         "stepwise does not run your forward(): cast its floating-point inputs to half in "
         "your loop, as DeepSpeed's forward() does with auto_cast (a half Linear or "
         "convolution refuses float inputs)"},
        {"fp16_master_weights_and_grads", "false", WhenOn::kRefuse,
         "half master weights are not implemented (stepwise keeps them in fp32); set it to "
         "false"},
        {"opt_level", "never", WhenOn::kNote,
         "DeepSpeed does not read it in \"fp16\" (it is Apex AMP's option, which stepwise does "
         "not implement)"},
        {"fp16_scale_tolerance", "never", WhenOn::kNote,
         "DeepSpeed does not read it either (an option of an older loss scaler)"}}},
      {"bf16",
       {{"immediate_grad_update", "true", WhenOn::kNote,
         "DeepSpeed reads it only in its bf16 ZeRO optimizer"},
        {"check_overflow", "false", WhenOn::kRefuse,
         "skipping bf16 steps on inf/nan gradients is not implemented; set it to false"},
        {"bf16_master_weights_and_grads", "false", WhenOn::kRefuse,
         "bf16 master weights are not implemented (stepwise keeps them in fp32); set it to "
         "false"},
        {"bf16_optimizer_states", "false", WhenOn::kRefuse,
         "bf16 optimizer states are not implemented (stepwise keeps them in fp32); set it to "
         "false"},
        // Loss-scale keys copied from an "fp16" section: DeepSpeed does not read them here.
        {"loss_scale", "never", WhenOn::kNote, kNoLossScale},
        {"initial_scale_power", "never", WhenOn::kNote, kNoLossScale},
        {"loss_scale_window", "never", WhenOn::kNote, kNoLossScale},
        {"hysteresis", "never", WhenOn::kNote, kNoLossScale},
        {"consecutive_hysteresis", "never", WhenOn::kNote, kNoLossScale},
        {"min_loss_scale", "never", WhenOn::kNote, kNoLossScale}}},
      {"checkpoint",
       {{"load_universal", "false", WhenOn::kRefuse,
         "universal checkpoints are not implemented; set it to false"},
        {"use_node_local_storage", "false", WhenOn::kNote,
         "stepwise writes the shared files from rank 0 and each rank's own file from that "
         "rank, on any file system"},
        {"parallel_write", "{\"pipeline_stage\": false}", WhenOn::kNote,
         "stepwise has no pipeline stages"}}},
  };
  const auto found = sections.find(section);
  TORCH_INTERNAL_ASSERT(found != sections.end(), "no DeepSpeed features for section ", section);
  return found->second;
}

namespace {

bool is_off(const DeepSpeedFeature& feature, const nlohmann::json& value) {
  if (std::strcmp(feature.off, "never") == 0) return false;
  if (std::strcmp(feature.off, "enabled") == 0) {
    if (value.is_boolean()) return !value.get<bool>();  // an older form: "amp": false
    if (!value.is_object()) return false;
    const auto enabled = value.find("enabled");
    return enabled == value.end() || *enabled == false;
  }
  return value == nlohmann::json::parse(feature.off);
}

}  // namespace

void read_feature(ObjectReader& reader, const DeepSpeedFeature& feature,
                  std::vector<std::string>& notes) {
  const auto& json = reader.json();
  if (!json.contains(feature.key)) return;
  reader.claim(feature.key);
  const auto& value = json.at(feature.key);
  if (is_off(feature, value)) return;
  const std::string path = reader.path_of(feature.key);
  if (feature.when_on == WhenOn::kNote) {
    notes.push_back(c10::str("\"", path, "\" has no effect in stepwise: ", feature.why));
    return;
  }
  const ConfigError error(
      c10::str("\"", path, "\" (value ", show(value),
               ") is a DeepSpeed feature stepwise does not support: ", feature.why));
  reader.fail(error);
}

void read_features(ObjectReader& reader, const std::string& section,
                   std::vector<std::string>& notes) {
  for (const auto& feature : deepspeed_features(section)) read_feature(reader, feature, notes);
}

const std::vector<std::string>& deepspeed_zero_keys() {
  // DeepSpeedZeroConfig's fields, then the aliases it accepts for them.
  static const std::vector<std::string> keys = {
      "stage",
      "contiguous_gradients",
      "reduce_scatter",
      "reduce_bucket_size",
      "use_multi_rank_bucket_allreduce",
      "allgather_partitions",
      "allgather_bucket_size",
      "overlap_comm",
      "load_from_fp32_weights",
      "elastic_checkpoint",
      "offload_param",
      "offload_optimizer",
      "zenflow",
      "sub_group_size",
      "cpu_offload_param",
      "cpu_offload_use_pin_memory",
      "cpu_offload",
      "prefetch_bucket_size",
      "param_persistence_threshold",
      "model_persistence_threshold",
      "max_live_parameters",
      "max_reuse_distance",
      "gather_16bit_weights_on_model_save",
      "module_granularity_threshold",
      "use_all_reduce_for_fetch_params",
      "allgather_sequential",
      "stage3_gather_fp16_weights_on_model_save",
      "ignore_unused_parameters",
      "legacy_stage1",
      "round_robin_gradients",
      "zero_hpz_partition_size",
      "zero_quantized_weights",
      "zero_quantized_nontrainable_weights",
      "zero_quantized_gradients",
      "zeropp_loco_param",
      "mics_shard_size",
      "mics_hierarchical_params_gather",
      "memory_efficient_linear",
      "pipeline_loading_checkpoint",
      "override_module_apply",
      "log_trace_cache_warnings",
      "enable_sanity_checks",
      "save_muon_momentum_buffer_in_memory",
      "leaf_module",
      "stage3_prefetch_bucket_size",
      "stage3_param_persistence_threshold",
      "stage3_model_persistence_threshold",
      "stage3_max_live_parameters",
      "stage3_max_reuse_distance",
      "stage3_gather_16bit_weights_on_model_save",
      "stage3_module_granularity_threshold",
      "stage3_use_all_reduce_for_fetch_params",
      "stage3_allgather_sequential",
  };
  return keys;
}

}  // namespace stepwise::detail

namespace stepwise {

std::vector<DeepSpeedFeatureKey> deepspeed_feature_keys() {
  std::vector<DeepSpeedFeatureKey> keys;
  for (const char* section : {"", "optimizer.params", "scheduler.params",
                              "scheduler.params (OneCycle)", "fp16", "bf16", "checkpoint"}) {
    const std::string prefix(section, std::strcspn(section, " "));  // "optimizer.params"
    for (const auto& f : detail::deepspeed_features(section)) {
      const std::string off = std::strcmp(f.off, "never") == 0     ? "-"
                              : std::strcmp(f.off, "enabled") == 0 ? "enabled: false"
                                                                   : f.off;
      keys.push_back({prefix.empty() ? f.key : prefix + "." + f.key, off,
                      f.when_on == detail::WhenOn::kNote ? "note" : "refused", f.why});
    }
  }
  return keys;
}

}  // namespace stepwise
