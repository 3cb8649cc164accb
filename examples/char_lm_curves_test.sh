#!/usr/bin/env bash
# example.char_lm.curves: the loss curves on docs/train-a-language-model.md are committed
# (docs/data/char-lm/, written by tools/char-lm-curves); this reruns the first 10 optimizer
# steps of one of them (GAS 1, micro-batch 32, a run planned for 150 steps) and requires
# the same rows, digit for digit, so a committed curve cannot drift from what the example does.
#   char_lm_curves_test.sh CHAR_LM COMMITTED_CSV SCRATCH_DIR
set -euo pipefail
lm=$1 committed=$2 scratch=$3
rm -rf "$scratch"
"$lm" --gas 1 --micro-batch 32 --steps 150 --stop-at 10 --target 100 --csv "$scratch" > /dev/null
fresh=$scratch/char_lm/Train_Samples_train_loss.csv
if ! diff <(head -n 11 "$committed") <(head -n 11 "$fresh"); then
  echo "the first 10 steps differ from $committed: rerun tools/char-lm-curves" >&2
  exit 1
fi
echo "the first 10 steps match $committed"
