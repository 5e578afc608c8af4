#!/usr/bin/env bash
# A rank killed mid-run (SIGKILL in the middle of the ring attention sweep of
# test_dist_ring) must make the whole job fail promptly with a message:
# mpirun exits non-zero, well before the timeout that would mean a hang.
# Usage: kill_rank.sh MPIEXEC QKV_CLI TESTS_BINARY_DIR
set -u
mpiexec=$1
bindir=$3
for np in 2 3 4; do
  victim=$((np - 1))
  start=$(date +%s)
  out=$(timeout -k 5 90 "$mpiexec" --oversubscribe --allow-run-as-root -np "$np" \
        "$bindir/test_dist_ring" --kill-rank "$victim" 2>&1)
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: np=$np: the job succeeded although rank $victim was killed" >&2
    echo "$out" | tail -n 20 >&2
    exit 1
  fi
  # mpirun itself passes the rank's signal on (137 = 128 + SIGKILL), so a
  # hang is told by the time taken (timeout's 124, or its kill after 90 s).
  if [ "$rc" -eq 124 ] || [ "$took" -ge 85 ]; then
    echo "FAIL: np=$np: the job hung after rank $victim was killed (timeout, status $rc)" >&2
    echo "$out" | tail -n 20 >&2
    exit 1
  fi
  if ! echo "$out" | grep -Eqi "signal|killed|terminated|abort"; then
    echo "FAIL: np=$np: no message about the killed rank:" >&2
    echo "$out" | tail -n 20 >&2
    exit 1
  fi
  echo "ok: np=$np: rank $victim killed -> mpirun exit status $rc after ${took}s: $(echo "$out" | grep -Ei 'signal|killed' | head -n 1)"
done
