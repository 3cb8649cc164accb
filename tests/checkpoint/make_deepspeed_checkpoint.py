"""Writes a checkpoint in DeepSpeed's stage-0 layout with PyTorch alone (DeepSpeed's own
save_checkpoint is not installed here): what deepspeed/runtime/engine.py (v0.14.5)
_save_checkpoint puts in mp_rank_00_model_states.pt for a Linear(4, 1) trained 2 steps
with AdamW and WarmupLR, the Python set and torch.Size objects included.

    make_deepspeed_checkpoint.py OUT_DIR

Also writes OUT_DIR/expected.txt: "name v1 v2 ..." lines (%.9g) of the weights and of
AdamW's exp_avg and exp_avg_sq per parameter, and "int name N" lines.
"""
import collections
import os
import sys

import torch


def main():
    out_dir = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    for step in range(2):
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    state = {
        "module": model.state_dict(),
        "buffer_names": [],
        "optimizer": optimizer.state_dict(),
        "param_shapes": [collections.OrderedDict((n, p.shape) for n, p in model.named_parameters())],
        "frozen_param_shapes": None,
        "shared_params": {},
        "frozen_param_fragments": None,
        "lr_scheduler": {"last_batch_iteration": 1},
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": 2,
        "global_samples": 16,
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}},
        "ds_version": "0.14.5",
    }
    folder = os.path.join(out_dir, "global_step2")
    os.makedirs(folder, exist_ok=True)
    torch.save(state, os.path.join(folder, "mp_rank_00_model_states.pt"))
    with open(os.path.join(out_dir, "latest"), "w") as f:
        f.write("global_step2")
    with open(os.path.join(out_dir, "expected.txt"), "w") as f:
        for name, p in model.named_parameters():
            f.write(name + " " + " ".join("%.9g" % v for v in p.detach().flatten().tolist()) + "\n")
        for index, s in optimizer.state_dict()["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                f.write(f"{key}/{index} " + " ".join("%.9g" % v for v in s[key].flatten().tolist()) + "\n")
        f.write("int global_steps 2\nint global_samples 16\n")


if __name__ == "__main__":
    main()
