#!/usr/bin/env bash
# mpirun -np P qkv attend --distributed reads and writes the same .npy files
# as one process: forward (out, lse) and backward (dq, dk, dv), causal and
# not, GQA (4 query heads, 2 key/value heads), n = 45 (uneven over 2..4
# ranks); then windows and the ReLU/sigmoid normalisers over 2 and 3 ranks;
# compared with the single-process qkv attend to float rounding.
# Usage: attend_dist.sh MPIEXEC QKV_CLI TESTS_BINARY_DIR
set -u
mpiexec=$1
qkv=$2
bindir=$3
tool=$bindir/test_dist_ring
tmp=$(mktemp -d "${QKV_TEST_TMP:-/tmp}/attend_dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
"$tool" --write-npy "$tmp" || { echo "FAIL: cannot write the inputs" >&2; exit 1; }
in=(--q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy" --grad-out "$tmp/dout.npy" --threads 1)
# "mask|other options|ranks"
cases=("none||1 2 3 4" "causal||1 2 3 4" "window:3,2||2 3" "causal-window:5||2 3"
       "causal|--norm relu --relu-count|2 3" "window:4,4|--norm sigmoid|2 3")
for c in "${cases[@]}"; do
  IFS='|' read -r mask extra nps <<<"$c"
  # shellcheck disable=SC2206
  more=($extra)
  tag=$(printf '%s%s' "$mask" "$extra" | tr -c 'a-z0-9' '_')
  one=$tmp/one-$tag
  mkdir -p "$one"
  "$qkv" attend "${in[@]}" --mask "$mask" "${more[@]}" -o "$one/out.npy" --lse "$one/lse.npy" \
    --dq "$one/dq.npy" --dk "$one/dk.npy" --dv "$one/dv.npy" || { echo "FAIL: one process ($c)" >&2; exit 1; }
  for np in $nps; do
    d=$tmp/np$np-$tag
    mkdir -p "$d"
    if ! timeout -k 5 120 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$qkv" attend --distributed \
        "${in[@]}" --mask "$mask" "${more[@]}" -o "$d/out.npy" --lse "$d/lse.npy" --dq "$d/dq.npy" --dk "$d/dk.npy" \
        --dv "$d/dv.npy"; then
      echo "FAIL: mpirun -np $np qkv attend --distributed --mask $mask $extra" >&2
      fails=$((fails + 1))
      continue
    fi
    for f in out lse; do "$tool" --compare "$d/$f.npy" "$one/$f.npy" 1e-5 || fails=$((fails + 1)); done
    for f in dq dk dv; do "$tool" --compare "$d/$f.npy" "$one/$f.npy" 1e-4 || fails=$((fails + 1)); done
  done
done
# Requests the ring cannot do are refused with a message and no output.
if timeout -k 5 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 "$qkv" attend --distributed \
    --q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy" -o "$tmp/bad.npy" --attn "$tmp/attn.npy" 2>"$tmp/err"; then
  echo "FAIL: --distributed --attn succeeded" >&2
  fails=$((fails + 1))
fi
grep -q "attention matrix" "$tmp/err" || { echo "FAIL: no message for --attn:" >&2; cat "$tmp/err" >&2; fails=$((fails + 1)); }
[ ! -e "$tmp/bad.npy" ] || { echo "FAIL: an output was left behind" >&2; fails=$((fails + 1)); }
if [ "$fails" -ne 0 ]; then
  echo "attend_dist: $fails failures" >&2
  exit 1
fi
echo "attend_dist: all distributed runs equal one process"
