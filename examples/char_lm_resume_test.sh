#!/bin/bash
# example.char_lm.resume: two ranks train the example for 12 steps without stopping; then
# the same run is stopped after 8 steps (a checkpoint every 4) and resumed in new
# processes. Both must end with the same loss, printed to 9 digits: the weights, the
# optimizer, the schedule and each rank's RNG (dropout masks, batches) came back.
#   char_lm_resume_test.sh LAUNCH CHAR_LM WORK_DIR
set -euo pipefail
launch=$1 char_lm=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
args=(--steps 12 --target 10 --save-every 4)
final() { grep -o 'final loss [0-9.e+-]*' | head -1; }
whole=$("$launch" -n 2 -- "$char_lm" "${args[@]}" --save "$work/whole" 2>&1 | final)
"$launch" -n 2 -- "$char_lm" "${args[@]}" --save "$work/split" --stop-at 8 >/dev/null 2>&1
out=$("$launch" -n 2 -- "$char_lm" "${args[@]}" --save "$work/split" 2>&1)
resumed=$(echo "$out" | final)
echo "uninterrupted: $whole; stopped at 8 and resumed: $resumed"
echo "$out" | grep -q "resumed at step 8" || { echo "FAIL: the second run did not resume"; exit 1; }
[ -n "$whole" ] && [ "$whole" = "$resumed" ] || { echo "FAIL: the resumed run ends elsewhere"; exit 1; }
echo "ok: the resumed run ends with the uninterrupted run's loss"
