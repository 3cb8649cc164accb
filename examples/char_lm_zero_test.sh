#!/bin/bash
# example.char_lm.zero: two ranks train the example (dropout, parameter groups, clipping,
# GAS 2) for 12 steps at ZeRO stages 0, 1 and 2 (docs/zero.md). Stage 1 must end with stage
# 0's loss to 9 digits; stage 2, which adds the micro-steps and the ranks in the other
# order, within 1e-5 of it; and stage 2 stopped after 6 steps and resumed in new processes
# with its uninterrupted loss to 9 digits.
#   char_lm_zero_test.sh LAUNCH CHAR_LM WORK_DIR
set -euo pipefail
launch=$1 char_lm=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
args=(--steps 12 --gas 2 --micro-batch 16 --target 10 --save-every 6)
final() { grep -o 'final loss [0-9.e+-]*' | head -1 | cut -d' ' -f3; }
run() { "$launch" -n 2 -- "$char_lm" "${args[@]}" "$@" 2>&1; }
zero=$(run --zero 0 | final)
one=$(run --zero 1 | final)
two=$(run --zero 2 --save "$work/whole" | final)
run --zero 2 --save "$work/split" --stop-at 6 >/dev/null
out=$(run --zero 2 --save "$work/split")
resumed=$(echo "$out" | final)
echo "final loss: stage 0 $zero, stage 1 $one, stage 2 $two, stage 2 resumed at 6 $resumed"
[ -n "$zero" ] && [ "$zero" = "$one" ] || { echo "FAIL: stage 1 differs from stage 0"; exit 1; }
awk -v a="$zero" -v b="$two" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' ||
  { echo "FAIL: stage 2 is not within 1e-5 of stage 0"; exit 1; }
echo "$out" | grep -q "resumed at step 6" || { echo "FAIL: stage 2 did not resume"; exit 1; }
[ "$two" = "$resumed" ] || { echo "FAIL: stage 2 resumed ends elsewhere"; exit 1; }
ls "$work/split/global_step12/zero_pp_rank_1_mp_rank_00_optim_states.pt" >/dev/null
echo "ok: stage 1 is stage 0, stage 2 within 1e-5, and resumes exactly"
