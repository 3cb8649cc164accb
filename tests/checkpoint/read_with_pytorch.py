"""Reads a checkpoint file stepwise wrote with Python's PyTorch (Debian's python3-torch)
and compares it with the values the C++ test wrote beside it (checkpoint_test.cpp,
Checkpoint.PythonPyTorchReadsTheFiles).

    read_with_pytorch.py MODEL_STATES.pt WINDOW.pt EXPECTED.txt

EXPECTED.txt: lines "KEY v1 v2 ..." for module tensors (exact float32 values, %.9g) and
"int KEY N" for integer entries. Prints what it checked; exits 1 on a difference.
"""
import sys

import torch


def load(path):
    # PyTorch >= 2.6 defaults to weights_only=True, which refuses the type tags LibTorch's
    # pickler writes (torch.jit._pickle.restore_type_tag); these files are the test's own.
    return torch.load(path, weights_only=False)


def main():
    states = load(sys.argv[1])
    window = load(sys.argv[2])
    errors, checked = [], 0
    for line in open(sys.argv[3]):
        parts = line.split()
        if parts[0] == "int":
            key, value = parts[1], int(parts[2])
            if states[key] != value:
                errors.append(f"{key}: {states[key]} != {value}")
        elif parts[0] == "grad":
            name, values = parts[1], torch.tensor([float(v) for v in parts[2:]])
            if not torch.equal(window["grads"][name].float().flatten(), values):
                errors.append(f"window grad {name}: {window['grads'][name]} != {values}")
        else:
            name, values = parts[0], torch.tensor([float(v) for v in parts[1:]])
            if not torch.equal(states["module"][name].float().flatten(), values):
                errors.append(f"module {name}: {states['module'][name]} != {values}")
        checked += 1
    if states["client_state"]["epoch"] != 7:
        errors.append(f"client_state: {states['client_state']}")
    print("\n".join(errors) if errors else
          f"python3-torch {torch.__version__} read {checked} entries; keys: {sorted(states)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
