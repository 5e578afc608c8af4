#!/usr/bin/env bash
# qkv train --precision fp32|bf16|fp16 (mixed precision, docs/HALF.md): each
# trains and reports its accuracy; the checkpoint records the precision and
# the fp16 loss scaler (so --resume goes on in it); a bad value and
# --precision with --resume are refused; bf16 and fp16 runs are bitwise the
# same for 1 and 2 threads.
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init train_precision "$@"
T=$TMP
args=(--task copy --seq 6 --symbols 8 --dim 16 --layers 1 --heads 2 --batch 8 --steps 30 --warmup 5 --seed 3 --quiet)

for p in fp32 bf16 fp16; do
  "$QKV" train "${args[@]}" --precision $p --threads 1 --out "$T/$p" > "$T/$p.out" 2>&1
  check $? "$p: trains"
  grep -q "^copy: exact-sequence accuracy" "$T/$p.out"
  check $? "$p: reports its accuracy"
  grep -aq "\"train.precision\":\"$p\"" "$T/$p/model.safetensors"
  check $? "$p: the checkpoint records the precision"
  "$QKV" eval --ckpt "$T/$p" --examples 32 > /dev/null 2>&1
  check $? "$p: eval reads the checkpoint"
done
grep -q "^fp16 loss scaling: 0 steps skipped" "$T/fp16.out"
check $? "fp16 reports its loss scaler: $(grep 'loss scaling' "$T/fp16.out")"
grep -aq '"train.loss_scale":"32768"' "$T/fp16/model.safetensors"
check $? "the checkpoint records the loss scale"
! cmp -s "$T/fp32/loss.csv" "$T/bf16/loss.csv"
check $? "bf16 computes something else than fp32"
for p in bf16 fp16; do
  "$QKV" train "${args[@]}" --precision $p --threads 2 --out "$T/${p}2" > /dev/null 2>&1
  check $? "$p: 2 threads"
  cmp -s <(cut -d, -f1-4 "$T/$p/loss.csv") <(cut -d, -f1-4 "$T/${p}2/loss.csv")
  check $? "$p: 1 and 2 threads give the same loss curve"
done

"$QKV" train "${args[@]}" --precision fp8 --out "$T/bad" > "$T/bad.out" 2>&1
[ $? = 2 ] && grep -q "fp8" "$T/bad.out"
check $? "a bad --precision is a usage error naming it: $(cat "$T/bad.out")"
"$QKV" train --resume "$T/fp16" --precision bf16 > "$T/res.out" 2>&1
[ $? = 2 ]
check $? "--precision with --resume is refused"
"$QKV" train --help | grep -q -- "--precision fp32|bf16|fp16"
check $? "help names --precision"

# fp16 killed at a random moment and resumed: the same loss curve and the
# same final scaler state as an uninterrupted run (the scale doubles at step
# 1000, which needs the clean-step count restored from the checkpoint).
long=(--task copy --seq 6 --symbols 8 --dim 16 --layers 1 --heads 2 --batch 8 --steps 1100 --warmup 5 --seed 3
      --quiet --precision fp16 --ckpt-every 50 --threads 1)
t0=$(now_ms)
"$QKV" train "${long[@]}" --out "$T/full" > /dev/null 2>&1
check $? "fp16: the long run"
run_ms=$(( $(now_ms) - t0 ))
grep -aq '"train.loss_scale":"65536"' "$T/full/model.safetensors"
check $? "fp16: the scale doubled once in 1100 clean steps"
killed=0
for trial in 1 2 3; do
  d="$T/killed$trial"
  "$QKV" train "${long[@]}" --out "$d" > /dev/null 2>&1 &
  pid=$!
  wait_for_file "$d/model.safetensors" "$pid"
  sleep_within "$run_ms"
  kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
  wait "$pid" 2>/dev/null
  "$QKV" train --resume "$d" --quiet > "$d.out" 2>&1
  check $? "fp16 trial $trial: resume"
  cmp -s <(cut -d, -f1-4 "$T/full/loss.csv") <(cut -d, -f1-4 "$d/loss.csv")
  check $? "fp16 trial $trial: the resumed loss curve equals the uninterrupted one"
  for k in loss_scale loss_scale_clean loss_scale_skipped; do
    [ "$(grep -ao "\"train.$k\":\"[0-9]*\"" "$T/full/model.safetensors")" = \
      "$(grep -ao "\"train.$k\":\"[0-9]*\"" "$d/model.safetensors")" ]
    check $? "fp16 trial $trial: train.$k as uninterrupted"
  done
done
echo "fp16 runs killed mid-way: $killed of 3"

cli_finish train_precision
