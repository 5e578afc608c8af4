#!/usr/bin/env bash
# qkv train / eval / generate: a run killed with SIGKILL at a random moment
# (also during a checkpoint write) always leaves a loadable checkpoint, and
# --resume continues exactly: the loss curve equals an uninterrupted run's.
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init train_resume "$@"
T=$TMP
args=(--task copy --seq 4 --symbols 6 --dim 16 --layers 1 --heads 2 --batch 8 --steps 1500 --ckpt-every 5 --seed 3 --quiet)

t0=$(now_ms)
"$QKV" train "${args[@]}" --out "$T/full" > "$T/full.out" 2>&1
check $? "uninterrupted run"
run_ms=$(( $(now_ms) - t0 ))
cut -d, -f1-4 "$T/full/loss.csv" > "$T/full.curve"

# Checkpoints every 5 steps: a good share of the run is spent writing them,
# so some of the random kills land inside a write (the temporary file).
killed=0
for trial in 1 2 3 4 5; do
  d="$T/killed$trial"
  "$QKV" train "${args[@]}" --out "$d" > /dev/null 2>&1 &
  pid=$!
  # A first checkpoint, then a kill at a random moment after it, within
  # the first half of a whole run's length.
  wait_for_file "$d/model.safetensors" "$pid"
  sleep_within "$run_ms"
  kill -9 "$pid" 2>/dev/null && killed=$((killed + 1))
  wait "$pid" 2>/dev/null
  "$QKV" eval --ckpt "$d" --examples 8 > /dev/null 2>&1
  check $? "trial $trial: the checkpoint left by a kill loads"
  "$QKV" train --resume "$d" --quiet > /dev/null 2>&1
  check $? "trial $trial: resume"
  cut -d, -f1-4 "$d/loss.csv" > "$d.curve"
  cmp -s "$T/full.curve" "$d.curve"
  check $? "trial $trial: resumed loss curve equals the uninterrupted one"
done

[ "$killed" -ge 1 ]
check $? "at least one run was killed mid-way ($killed of 5)"

# A full disk during a checkpoint write (a file-size limit; SIGXFSZ ignored
# so the write fails with EFBIG as on a full disk): a clear error, a failing
# exit, and the previous checkpoint kept intact.
d="$T/full_disk"
"$QKV" train "${args[@]}" --steps 50 --ckpt-every 25 --out "$d" > /dev/null 2>&1
cp "$d/model.safetensors" "$T/before.safetensors"
size=$(( $(stat -c %s "$d/model.safetensors") / 1024 / 2 ))   # KiB: half a checkpoint
( trap '' XFSZ; ulimit -f "$size"; "$QKV" train "${args[@]}" --steps 50 --ckpt-every 25 --seed 4 --out "$d" > /dev/null 2> "$T/err" ) 2>/dev/null
rc=$?
[ $rc -ne 0 ] && grep -q "cannot write the checkpoint" "$T/err" && cmp -s "$d/model.safetensors" "$T/before.safetensors"
check $? "full disk: error '$(head -c 200 "$T/err")', previous checkpoint intact"
"$QKV" eval --ckpt "$d" --examples 8 > /dev/null 2>&1
check $? "full disk: the kept checkpoint still loads"
[ -z "$(ls "$d" | grep -i tmp)" ]
check $? "full disk: no temporary file left behind"

# The loss curve picture (without PNG: none, said once, and not announced).
pictures "$T/full.out" "$T/full/loss.png"
if with_png; then grep -q "^loss curve: $T/full/loss.png$" "$T/full.out"; else ! grep -q "^loss curve:" "$T/full.out"; fi
check $? "the summary names loss.png exactly when it is drawn"

# Thread count does not change the numbers.
"$QKV" train "${args[@]}" --threads 1 --out "$T/t1" > /dev/null 2>&1 && cut -d, -f1-4 "$T/t1/loss.csv" > "$T/t1.curve"
cmp -s "$T/full.curve" "$T/t1.curve"
check $? "1 thread gives the same loss curve bit for bit"

# eval and generate on the finished run.
"$QKV" eval --ckpt "$T/full" --examples 64 | grep -q "exact-sequence accuracy"
check $? "eval reports accuracy"
out=$("$QKV" generate --ckpt "$T/full" --prompt "1 2 3 4 6" --tokens 4 --temperature 0)
[ "$(echo "$out" | wc -w)" = 9 ]
check $? "generate continues the prompt by 4 tokens: '$out'"
for kv in bf16 int8; do
    out_kv=$("$QKV" generate --ckpt "$T/full" --prompt "1 2 3 4 6" --tokens 4 --temperature 0 --kv-cache $kv)
    [ "$(echo "$out_kv" | wc -w)" = 9 ]
    check $? "generate --kv-cache $kv continues the prompt by 4 tokens: '$out_kv'"
done
"$QKV" generate --ckpt "$T/full" --prompt "1 2" --kv-cache fp8 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ] && grep -q "unknown cache type 'fp8'" "$T/err"
check $? "generate --kv-cache fp8 is a usage error"
"$QKV" train --task copy --seq 4 --symbols 6 --dim 16 --layers 1 --heads 2 --batch 8 --steps 5 --pos relative \
    --seed 3 --quiet --out "$T/rel" > /dev/null 2>&1
"$QKV" generate --ckpt "$T/rel" --prompt "1 2" --tokens 2 --kv-cache int8 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "int8 caches do not serve this model's attention" "$T/err"
check $? "generate --kv-cache int8 refuses T5 relative biases with a clear message"

# Errors: clear message, non-zero exit, no folder or file made.
"$QKV" train --task copy --out "$T/none" --seq 0 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--seq" "$T/err" && [ ! -e "$T/none" ]
check $? "bad --seq is a usage error naming the option and creates nothing"
"$QKV" train --task text --out "$T/none" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ] && grep -q "needs a text file" "$T/err"
check $? "text without a file"
"$QKV" train --task text "$T/missing.txt" --out "$T/none" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "missing.txt" "$T/err"
check $? "missing corpus named"
"$QKV" train --task copy --heads 3 --out "$T/none" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--heads" "$T/err" && [ ! -e "$T/none" ]
check $? "heads not dividing the dimension"
"$QKV" train --resume "$T/nothing" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "nothing/model.safetensors" "$T/err"
check $? "resume without a checkpoint names the file"
"$QKV" train --resume "$T/full" --task copy > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ]
check $? "resume with other settings is refused"
printf 'garbage' > "$T/bad.safetensors"; mkdir -p "$T/bad"; cp "$T/bad.safetensors" "$T/bad/model.safetensors"
"$QKV" eval --ckpt "$T/bad" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "model.safetensors" "$T/err"
check $? "a damaged checkpoint is named"
"$QKV" generate --ckpt "$T/full" --prompt "1 99" > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q -- "--prompt" "$T/err"
check $? "a prompt token out of range"

cli_finish
