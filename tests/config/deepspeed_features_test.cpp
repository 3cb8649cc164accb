// DeepSpeed's features that stepwise does not implement: accepted when off, noted when
// they do not change the numbers, refused by name when they would; every problem of a
// file in one error; HF's "auto" (NOTE: [off means off], NOTE: [every problem at once]).
#include <stepwise/config.h>
#include <stepwise/errors.h>
#include <stepwise/loss_scaler.h>

#include <gtest/gtest.h>

#include "support/error_of.h"

namespace stepwise {
namespace {

std::string refusal_of(const std::string& json) {
  return testing::error_of<ConfigError>([&] { Config::from_string(json); });
}

TEST(DeepSpeedFeatures, WhatIsOffOrAtDeepSpeedsDefaultIsAcceptedWithoutANote) {
  const auto config = Config::from_string(R"({
    "train_batch_size": 8,
    "prescale_gradients": false, "gradient_predivide_factor": 1.0,
    "zero_allow_untested_optimizer": false, "zero_force_ds_cpu_optimizer": true,
    "wall_clock_breakdown": false, "memory_breakdown": false, "dump_state": false,
    "sparse_gradients": false, "fp32_allreduce": false, "communication_data_type": null,
    "comms_logger": {"enabled": false, "verbose": false},
    "tensorboard": {"enabled": false, "output_path": "tb/"},
    "flops_profiler": {"enabled": false}, "wandb": {"enabled": false},
    "csv_monitor": {"enabled": false}, "amp": {"enabled": false, "opt_level": "O1"},
    "progressive_layer_drop": {"enabled": false}, "data_efficiency": {"enabled": false},
    "curriculum_learning": {"enabled": false}, "elasticity": {"enabled": false},
    "fp16": {"enabled": false, "auto_cast": false, "fp16_master_weights_and_grads": false},
    "bf16": {"enabled": false, "immediate_grad_update": true, "check_overflow": false},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "bias_correction": true}},
    "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": -1}},
    "checkpoint": {"load_universal": false, "use_node_local_storage": false},
    "zero_optimization": {"stage": 0}
  })");
  EXPECT_TRUE(config.notes.empty()) << config.notes.front();
}

TEST(DeepSpeedFeatures, WhatOnlyObservesIsAcceptedWithOneNoteEach) {
  const auto config = Config::from_string(R"({
    "train_batch_size": 8,
    "comms_logger": {"enabled": true},
    "activation_checkpointing": {"partition_activations": false},
    "zero_allow_untested_optimizer": true,
    "zero_optimization": {"stage": 0, "reduce_bucket_size": 5e8,
                          "offload_optimizer": {"device": "cpu"}},
    "fp16": {"fp16_scale_tolerance": 0.25, "auto_cast": true}
  })");
  const std::vector<std::string> expected = {
      "\"fp16.auto_cast\" has no effect in stepwise: stepwise does not run your forward(): "
      "cast its floating-point inputs to half in your loop, as DeepSpeed's forward() does "
      "with auto_cast (a half Linear or convolution refuses float inputs)",
      "\"fp16.fp16_scale_tolerance\" has no effect in stepwise: DeepSpeed does not read it "
      "either (an option of an older loss scaler)",
      "zero_optimization keys with no effect at stage 0 (DeepSpeed reads them only at stages "
      "1-3): reduce_bucket_size",
      "\"activation_checkpointing\" has no effect in stepwise: DeepSpeed recomputes "
      "activations only where the model calls deepspeed.checkpointing.checkpoint(); a "
      "LibTorch model does its own recomputation",
      "\"comms_logger\" has no effect in stepwise: stepwise does not log its collectives; the "
      "progress line shows the all-reduce time with wall_clock_breakdown",
      "\"zero_allow_untested_optimizer\" has no effect in stepwise: stepwise's ZeRO stages 1 "
      "and 2 shard whole tensors, so an optimizer runs sharded as it runs unsharded (Lamb, "
      "which DeepSpeed steps on flat partitions, is refused at those stages)"};
  EXPECT_EQ(config.notes, expected);
}

TEST(DeepSpeedFeatures, WhatWouldChangeTheNumbersIsRefusedByName) {
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "fp32_allreduce": true})"),
            "\"fp32_allreduce\" (value true) is a DeepSpeed feature stepwise does not support: "
            "all-reducing half or bf16 gradients in fp32 is not implemented; set it to false");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8,
                         "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})"),
            "\"fp16.fp16_master_weights_and_grads\" (value true) is a DeepSpeed feature "
            "stepwise does not support: half master weights are not implemented (stepwise "
            "keeps them in fp32); set it to false");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8,
                         "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}})"),
            "\"optimizer.params.max_grad_norm\" (value 1.0) is a DeepSpeed feature stepwise "
            "does not support: it is not supported as an optimizer parameter, as in "
            "DeepSpeed: use the top-level \"gradient_clipping\" instead");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "amp": {"enabled": true}})"),
            "\"amp\" (value {\"enabled\":true}) is a DeepSpeed feature stepwise does not "
            "support: Apex AMP is not implemented; use \"fp16\" or \"bf16\" instead");
}

TEST(DeepSpeedFeatures, EveryProblemOfAFileIsInOneErrorNumbered) {
  EXPECT_EQ(refusal_of(R"({
    "train_batch_size": 8, "gradient_clipping": -1, "steps_per_print": "10",
    "fp32_allreduce": true, "optimizer": {"type": "AdamW", "params": {"lr": "auto",
    "weight_decay": "auto"}}, "zero_optimization": {"stage": 3}, "bf16": {"enabeld": true}
  })"),
            "7 problems in the configuration (fix them all, then run again):\n"
            "  1. gradient_clipping must be a finite number in [0, 3.40282e+38], got -1\n"
            "  2. steps_per_print must be an integer, got string \"10\"\n"
            "  3. optimizer.params.lr is \"auto\", HF Trainer's placeholder: fill it with "
            "AutoValues' learning_rate, or write the value\n"
            "  4. optimizer.params.weight_decay is \"auto\", HF Trainer's placeholder: fill it "
            "with AutoValues' weight_decay, or write the value\n"
            "  5. unknown key bf16.enabeld (value true); valid keys here are: enabled\n"
            "  6. zero_optimization.stage 3 partitions the parameters themselves, which "
            "stepwise does not implement; use stage 2 (the optimizer state, the fp32 masters "
            "and the gradients sharded) or 1\n"
            "  7. \"fp32_allreduce\" (value true) is a DeepSpeed feature stepwise does not "
            "support: all-reducing half or bf16 gradients in fp32 is not implemented; set it to "
            "false");
}

TEST(DeepSpeedFeatures, AnAutoBatchSizeIsDerivedFromTheOthers) {
  const auto config = Config::from_string(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})");
  EXPECT_FALSE(config.train_batch_size.has_value());
  EXPECT_EQ(config.resolve_batch_sizes(2).train_batch_size, 16);
}

TEST(DeepSpeedFeatures, AutoValuesFillHfsPlaceholdersWithTheTrainersMeaning) {
  const std::string hf = R"({
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
      "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}
  })";
  const auto config = Config::from_string(hf, AutoValues()
                                                  .per_device_train_batch_size(4)
                                                  .gradient_accumulation_steps(2)
                                                  .max_grad_norm(0.5)
                                                  .learning_rate(3e-4)
                                                  .adam_beta1(0.8)
                                                  .adam_beta2(0.95)
                                                  .adam_epsilon(1e-6)
                                                  .weight_decay(0.1)
                                                  .warmup_steps(10)
                                                  .num_training_steps(200)
                                                  .bf16(true));
  EXPECT_EQ(config.resolve_batch_sizes(2).train_batch_size, 16);  // derived, as HF does
  EXPECT_EQ(config.gradient_clipping, 0.5);
  EXPECT_EQ(config.precision.mode(), PrecisionMode::kBf16);
  EXPECT_EQ(config.optimizer->lr(), 3e-4);
  EXPECT_EQ(config.optimizer->betas(), (std::array<double, 2>{0.8, 0.95}));
  EXPECT_EQ(config.optimizer->eps(), 1e-6);
  EXPECT_EQ(config.optimizer->weight_decay(), 0.1);
  const auto& schedule = std::get<WarmupDecayLROptions>(*config.scheduler);
  EXPECT_EQ(schedule.warmup().warmup_min_lr(), 0.0);  // HF fills it with 0
  EXPECT_EQ(schedule.warmup().warmup_max_lr(), 3e-4);
  EXPECT_EQ(schedule.warmup().warmup_num_steps(), 10);
  EXPECT_EQ(schedule.total_num_steps(), 200);
  // Unfilled, every "auto" is named with the field that fills it, in one error.
  const std::string message = refusal_of(hf);
  EXPECT_EQ(message.substr(0, message.find('\n')),
            "12 problems in the configuration (fix them all, then run again):");
  EXPECT_NE(message.find("  1. train_batch_size is \"auto\", HF Trainer's placeholder, and the "
                         "other batch sizes do not determine it: write the value\n"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("gradient_accumulation_steps is \"auto\", HF Trainer's placeholder, "
                         "and the other batch sizes do not determine it: fill it with "
                         "AutoValues' gradient_accumulation_steps, or write the value"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("scheduler.params.total_num_steps is \"auto\", HF Trainer's "
                         "placeholder: fill it with AutoValues' num_training_steps, or write "
                         "the value"),
            std::string::npos)
      << message;
}

TEST(DeepSpeedFeatures, TheDeprecatedBooleanZeroFormIsReadAsDeepSpeedReadsIt) {
  const auto off = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": false})");
  EXPECT_EQ(off.zero.stage(), 0);
  ASSERT_EQ(off.notes.size(), 1u);
  EXPECT_EQ(off.notes[0],
            "\"zero_optimization\": false is DeepSpeed's deprecated form of {\"stage\": 0}; "
            "write that instead");
  const auto on = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": true})");
  EXPECT_EQ(on.zero.stage(), 1);
  ASSERT_EQ(on.notes.size(), 1u);
  EXPECT_EQ(on.notes[0],
            "\"zero_optimization\": true is DeepSpeed's deprecated form of {\"stage\": 1}; "
            "write that instead");
}

TEST(DeepSpeedFeatures, ZeroStageOneHonoursItsBucketsAndNamesTheRest) {
  const auto c = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {
    "stage": 1, "reduce_bucket_size": 1000, "allgather_bucket_size": 2000,
    "overlap_comm": false, "contiguous_gradients": true, "reduce_scatter": true,
    "offload_optimizer": {"device": "none"}}})");
  EXPECT_EQ(c.zero.stage(), 1);
  EXPECT_EQ(c.zero.allgather_bucket_size(), 2000);
  EXPECT_EQ(c.reducer.bucket_size(), 1000);
  EXPECT_FALSE(c.reducer.overlap_comm());
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0],
            "zero_optimization keys with no effect at stage 1 here (see docs/zero.md): "
            "contiguous_gradients, reduce_scatter, offload_optimizer");
  // Stage 2 honours the same keys (NOTE: [stage 2 gradients]).
  const auto two = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {
    "stage": 2, "reduce_bucket_size": 1000, "overlap_comm": false, "round_robin_gradients": true}})");
  EXPECT_EQ(two.zero.stage(), 2);
  EXPECT_EQ(two.reducer.bucket_size(), 1000);
  EXPECT_FALSE(two.reducer.overlap_comm());
  ASSERT_EQ(two.notes.size(), 1u);
  EXPECT_EQ(two.notes[0],
            "zero_optimization keys with no effect at stage 2 here (see docs/zero.md): "
            "round_robin_gradients");
  // At stage 0 the same keys change nothing, as in DeepSpeed.
  const auto zero = Config::from_string(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 0, "reduce_bucket_size": 1000}})");
  EXPECT_EQ(zero.reducer.bucket_size(), 500000000);
  // The reducer's keys in both sections: the same value is one setting, two are refused.
  const auto both = Config::from_string(R"({"train_batch_size": 8, "stepwise": {
    "reduce_bucket_size": 1000}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000}})");
  EXPECT_EQ(both.reducer.bucket_size(), 1000);
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "stepwise": {"overlap_comm": false},
              "zero_optimization": {"stage": 1, "overlap_comm": true}})"),
            "zero_optimization.overlap_comm is true and stepwise.overlap_comm is false; both "
            "set the gradient reducer's overlap at ZeRO stage 1: keep one");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "stepwise": {"reduce_bucket_size": 10},
              "zero_optimization": {"stage": 1, "reduce_bucket_size": 1000}})"),
            "zero_optimization.reduce_bucket_size is 1000 and stepwise.reduce_bucket_size is "
            "10; both set the gradient reducer's bucket size at ZeRO stage 1: keep one");
  // NOTE: [ZeRO-Offload]: to the CPU is read (initialize decides by the parameters'
  // device), to NVMe refused; offload_param is ZeRO-3's, noted at stages 1 and 2.
  const auto offloaded = Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {
    "stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(offloaded.zero.offload_optimizer());
  EXPECT_TRUE(offloaded.zero.force_ds_cpu_optimizer());
  ASSERT_EQ(offloaded.notes.size(), 1u);
  EXPECT_EQ(offloaded.notes[0],
            "zero_optimization keys with no effect at stage 2 here (see docs/zero.md): "
            "offload_param");
  EXPECT_TRUE(Config::from_string(R"({"train_batch_size": 8, "zero_force_ds_cpu_optimizer": false,
    "zero_optimization": {"stage": 1, "cpu_offload": true}})")
                  .zero.offload_optimizer());
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
              "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}})"),
            "zero_optimization.offload_optimizer.device \"nvme\" turns on ZeRO-Infinity's NVMe "
            "offload, which stepwise does not implement: use \"cpu\" (with the model on the "
            "CPU, where the state already is) or \"none\"");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
              "cpu_offload": false, "offload_optimizer": {"device": "cpu"}}})"),
            "zero_optimization has both cpu_offload and offload_optimizer, which DeepSpeed "
            "refuses (the first is the older name of the second): keep offload_optimizer");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
              "offload_optimizer": {"device": "cpu", "pin_memroy": true}}})"),
            "unknown key zero_optimization.offload_optimizer.pin_memroy (value true); valid keys "
            "here are: device, nvme_path, buffer_count, pin_memory, pipeline_read, "
            "pipeline_write, fast_init, ratio, super_offload, cpuadam_cores_perc");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
              "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})"),
            "zero_optimization.offload_optimizer.ratio is 0.3: partial offload is ZeRO stage 3's "
            "only, as DeepSpeed asserts; drop it");
  // Read at stage 0 too (DeepSpeed's zero_use_cpu_optimizer does not look at the stage).
  EXPECT_TRUE(Config::from_string(R"({"train_batch_size": 8, "zero_optimization": {
    "stage": 0, "offload_optimizer": {"device": "cpu"}}})")
                  .zero.offload_optimizer());
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {
              "amsgrad": true, "torch_adam": true}}, "zero_optimization": {"stage": 1,
              "offload_optimizer": {"device": "cpu"}}})"),
            "optimizer.params.amsgrad with zero_optimization.offload_optimizer: DeepSpeed's CPU "
            "Adam ignores amsgrad there (plain Adam), which stepwise does not imitate; drop "
            "amsgrad or the offload");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"},
              "zero_optimization": {"stage": 1}})"),
            "optimizer.type \"Lamb\" at zero_optimization.stage 1: DeepSpeed then computes one "
            "trust ratio per rank's flat partition, which stepwise (whole tensors, one ratio "
            "each) does not reproduce; use stage 0");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
              "offload_optimizer": {"device": "disk"}}})"),
            "zero_optimization.offload_optimizer.device is \"disk\"; DeepSpeed's devices are "
            "\"none\", \"cpu\" and \"nvme\"");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})"),
            "zero_optimization.stage 3 partitions the parameters themselves, which stepwise "
            "does not implement; use stage 2 (the optimizer state, the fp32 masters and the "
            "gradients sharded) or 1");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})"),
            "zero_optimization.stage is 4; DeepSpeed's stages are 0, 1, 2 and 3");
  EXPECT_EQ(refusal_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
              "allgather_bucket_size": 0}})"),
            "zero_optimization.allgather_bucket_size is 0; it counts elements per broadcast: "
            "use a positive number (DeepSpeed's default is 500000000)");
}

TEST(DeepSpeedFeatures, AZeroMinLossScaleIsNoFloorAsInDeepSpeed) {
  const auto config = Config::from_string(R"({"train_batch_size": 8, "fp16": {"enabled": true,
                              "min_loss_scale": 0, "initial_scale_power": 2, "hysteresis": 1}})");
  LossScaler scaler(config.precision.loss_scaler());
  int halvings = 0;
  try {
    for (; halvings < 2000; ++halvings) scaler.update(/*overflow=*/true);
    FAIL() << "the scale never stopped halving";
  } catch (const TrainingError&) {
  }
  EXPECT_GT(scaler.scale(), 0.0);  // stopped at the smallest scale, before 0
  EXPECT_GT(halvings, 1000);       // 4 halves down to the smallest denormal double
}

}  // namespace
}  // namespace stepwise
