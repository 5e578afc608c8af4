#!/usr/bin/env bash
# qkv train --task recall: the curriculum on the number of pairs (it starts
# at 4 pairs) is part of the checkpoint, so a run killed at a random moment
# and resumed gives the loss curve of an uninterrupted run; the checkpoint
# records the curriculum's state; eval measures the full number of pairs.
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init train_recall_resume "$@"
T=$TMP
args=(--task recall --seq 6 --symbols 8 --dim 16 --layers 1 --heads 2 --batch 8 --steps 600 --ckpt-every 5 --seed 5 --quiet)

t0=$(now_ms)
"$QKV" train "${args[@]}" --out "$T/full" > "$T/full.out" 2>&1
check $? "uninterrupted run"
run_ms=$(( $(now_ms) - t0 ))
cut -d, -f1-4 "$T/full/loss.csv" > "$T/full.curve"
grep -aq '"run.cur_length":"4"' "$T/full/model.safetensors"
check $? "the checkpoint records the curriculum (4 pairs: this tiny run does not get past them)"
grep -q "^recall: .* on 512 fresh examples" "$T/full.out"
check $? "the run reports its accuracy"
"$QKV" eval --ckpt "$T/full" --examples 64 > "$T/eval.out" 2>&1
grep -q "^recall (seq 6): " "$T/eval.out"
check $? "eval measures the task's 6 pairs: $(cat "$T/eval.out")"

killed=0
for trial in 1 2; do
  d="$T/killed$trial"
  "$QKV" train "${args[@]}" --out "$d" > /dev/null 2>&1 &
  pid=$!
  wait_for_file "$d/model.safetensors" "$pid"
  sleep_within "$run_ms"
  kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
  wait "$pid" 2>/dev/null
  "$QKV" train --resume "$d" --quiet > /dev/null 2>&1
  check $? "trial $trial: resume"
  cut -d, -f1-4 "$d/loss.csv" > "$d.curve"
  cmp -s "$T/full.curve" "$d.curve"
  check $? "trial $trial: resumed loss curve equals the uninterrupted one"
done
[ "$killed" -ge 1 ]
check $? "at least one run was killed mid-way ($killed of 2)"

cli_finish train_recall_resume
