#!/usr/bin/env bash
# Data-parallel training: mpirun -np P qkv train gives the loss curve of one
# process with the whole batch (each rank a slice of every batch, gradients
# summed with MPI_Iallreduce in buckets started during the backward); only
# rank 0 writes the log and the checkpoint, and rank 0 alone reports; the
# same P twice gives the same loss.csv bit for bit.
# Usage: train_dp.sh MPIEXEC QKV_CLI TESTS_BINARY_DIR
set -u
mpiexec=$1
qkv=$2
tmp=$(mktemp -d "${QKV_TEST_TMP:-/tmp}/train_dp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
png=${QKV_TEST_WITH_PNG:-}
case $png in
1 | 0) ;;
*) echo "QKV_TEST_WITH_PNG is '$png': run the test through ctest, or set it to 1 (a build with PNG) or 0" >&2; exit 1 ;;
esac
args=(--task copy --seq 6 --symbols 8 --layers 1 --dim 32 --heads 2 --batch 10 --steps 24 --warmup 3
      --seed 5 --threads 1 --ckpt-every 12 --quiet)
"$qkv" train "${args[@]}" --out "$tmp/one" >/dev/null || { echo "FAIL: one process" >&2; exit 1; }
fails=0
# loss column (2) of two loss.csv files: max relative difference
cmp_loss() {
  awk -F, 'NR==FNR { if (FNR > 1) a[$1] = $2; next }
           FNR > 1 { n++; d = $2 - a[$1]; if (d < 0) d = -d; r = d / (a[$1] > 0 ? a[$1] : 1); if (r > m) m = r }
           END { printf "%d steps, max relative loss difference %.3g\n", n, m; exit !(n >= 24 && m < 2e-4) }' "$1" "$2"
}
for np in 2 3 4; do
  d=$tmp/np$np
  if ! timeout -k 5 240 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" "$qkv" train "${args[@]}" \
      --out "$d" >"$tmp/log$np" 2>&1; then
    echo "FAIL: mpirun -np $np qkv train" >&2
    tail -n 20 "$tmp/log$np" >&2
    fails=$((fails + 1))
    continue
  fi
  printf 'np=%d: ' "$np"
  cmp_loss "$tmp/one/loss.csv" "$d/loss.csv" || { echo "FAIL: np=$np loss curve differs" >&2; fails=$((fails + 1)); }
  [ -f "$d/model.safetensors" ] || { echo "FAIL: np=$np: no checkpoint" >&2; fails=$((fails + 1)); }
  # The loss curve from rank 0 in a build with PNG; none without (said once).
  if [ "$png" = 1 ]; then
    [ -s "$d/loss.png" ] || { echo "FAIL: np=$np: no loss.png" >&2; fails=$((fails + 1)); }
  elif [ -e "$d/loss.png" ] || [ "$(grep -c "pictures not drawn" "$tmp/log$np")" != 1 ]; then
    echo "FAIL: np=$np: without PNG, loss.png or not once 'pictures not drawn'" >&2
    fails=$((fails + 1))
  fi
  n_acc=$(grep -c "exact-sequence accuracy" "$tmp/log$np")
  [ "$n_acc" = 1 ] || { echo "FAIL: np=$np: $n_acc ranks reported (want rank 0 only)" >&2; fails=$((fails + 1)); }
  if ls "$d" | grep -q "tmp"; then echo "FAIL: np=$np: temporary files left: $(ls "$d")" >&2; fails=$((fails + 1)); fi
done
# Bit for bit reproducible for a given P: the same run again gives the same
# loss and gradient-norm columns (1-4; column 5 is the time).
np=3
if timeout -k 5 240 "$mpiexec" --oversubscribe --allow-run-as-root -np $np "$qkv" train "${args[@]}" \
    --out "$tmp/again" >"$tmp/log_again" 2>&1; then
  if cmp -s <(cut -d, -f1-4 "$tmp/np$np/loss.csv") <(cut -d, -f1-4 "$tmp/again/loss.csv"); then
    echo "np=$np twice: loss.csv identical (steps, loss, lr, gradient norm)"
  else
    echo "FAIL: np=$np run twice: loss.csv differs" >&2
    fails=$((fails + 1))
  fi
else
  echo "FAIL: mpirun -np $np qkv train (second run)" >&2
  fails=$((fails + 1))
fi
if [ "$fails" -ne 0 ]; then
  echo "train_dp: $fails failures" >&2
  exit 1
fi
echo "train_dp: data-parallel loss curves equal one process"
