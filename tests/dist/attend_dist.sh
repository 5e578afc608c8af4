#!/usr/bin/env bash
# mpirun -np P qkv attend --distributed reads and writes the same .npy files
# as one process: forward (out, lse) and backward (dq, dk, dv), causal and
# not, GQA (4 query heads, 2 key/value heads), n = 45 (uneven over 2..4
# ranks); then windows and the ReLU/sigmoid normalisers over 2 and 3 ranks;
# --bias (shared, and per head with -inf entries) with its gradient --dbias
# (each rank holds only its queries' bias rows); packed sequences
# (--seq-offsets, B = 1, sequences of length 1 straddling rank boundaries),
# also with a bias; compared with the single-process qkv attend to float
# rounding.
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
in2=(--q "$tmp/q.npy" --k "$tmp/k.npy" --v "$tmp/v.npy" --grad-out "$tmp/dout.npy" --threads 1)
in1=(--q "$tmp/q1.npy" --k "$tmp/k1.npy" --v "$tmp/v1.npy" --grad-out "$tmp/dout1.npy" --threads 1)
b=$tmp/bias.npy
bh=$tmp/biash.npy
so=$tmp/so.npy
# "mask|other options|ranks|inputs (2: B = 2, 1: B = 1)"; with --bias the
# bias gradient --dbias is compared too.
cases=("none||1 2 3 4|2" "causal||1 2 3 4|2" "window:3,2||2 3|2" "causal-window:5||2 3|2"
       "causal|--norm relu --relu-count|2 3|2" "window:4,4|--norm sigmoid|2 3|2"
       "causal|--bias $b|1 2 3 4|2" "window:4,4|--bias $bh|2 3|2"
       "causal|--seq-offsets $so|1 2 3 4|1" "window:3,2|--seq-offsets $so|2 4|1"
       "none|--seq-offsets $so --bias $bh|3|1")
for c in "${cases[@]}"; do
  IFS='|' read -r mask extra nps set <<<"$c"
  # shellcheck disable=SC2206
  more=($extra)
  if [ "$set" = 1 ]; then in=("${in1[@]}"); else in=("${in2[@]}"); fi
  outs=(out lse dq dk dv)
  case "$extra" in *--bias*) outs+=(dbias) ;; esac
  tag=$(printf '%s%s' "$mask" "${extra//$tmp/}" | tr -c 'a-z0-9' '_')
  one=$tmp/one-$tag
  mkdir -p "$one"
  oneo=()
  for f in "${outs[@]}"; do oneo+=("--$f" "$one/$f.npy"); done
  "$qkv" attend "${in[@]}" --mask "$mask" "${more[@]}" "${oneo[@]}" || { echo "FAIL: one process ($c)" >&2; exit 1; }
  for np in $nps; do
    d=$tmp/np$np-$tag
    mkdir -p "$d"
    dist=()
    for f in "${outs[@]}"; do dist+=("--$f" "$d/$f.npy"); done
    if ! timeout -k 5 120 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$qkv" attend --distributed \
        "${in[@]}" --mask "$mask" "${more[@]}" "${dist[@]}"; then
      echo "FAIL: mpirun -np $np qkv attend --distributed --mask $mask $extra" >&2
      fails=$((fails + 1))
      continue
    fi
    for f in "${outs[@]}"; do
      tol=1e-4
      case $f in out | lse) tol=1e-5 ;; esac
      "$tool" --compare "$d/$f.npy" "$one/$f.npy" $tol || { echo "  ($f: np $np, $c)" >&2; fails=$((fails + 1)); }
    done
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
# Each rank reads its own rows of the files: a truncated input fails every
# rank with a message (no hang: the ranks agree on the reads' status before
# they communicate) and writes nothing.
head -c 3000 "$tmp/k.npy" >"$tmp/kcut.npy"
for np in 1 3; do
  if timeout -k 5 60 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$qkv" attend --distributed \
      --q "$tmp/q.npy" --k "$tmp/kcut.npy" --v "$tmp/v.npy" --mask causal -o "$tmp/cut.npy" 2>"$tmp/err"; then
    echo "FAIL: --distributed with a truncated --k succeeded (np $np)" >&2
    fails=$((fails + 1))
  fi
  grep -q "truncated" "$tmp/err" || { echo "FAIL: no 'truncated' message (np $np):" >&2; cat "$tmp/err" >&2; fails=$((fails + 1)); }
  [ ! -e "$tmp/cut.npy" ] || { echo "FAIL: an output was left behind (np $np)" >&2; fails=$((fails + 1)); }
done
if [ "$fails" -ne 0 ]; then
  echo "attend_dist: $fails failures" >&2
  exit 1
fi
echo "attend_dist: all distributed runs equal one process"
