#!/bin/sh
# qkv's encoder beside sentence-transformers and ONNX Runtime in one run, on
# the workloads of make_encoder_texts.py (docs/BENCHMARKS.md, "Encoders"):
#   A  2,048 short sentences, the whole file in one call (throughput)
#   B  256 texts of 256 tokens (throughput)
#   C  one 10-token sentence per call, 200 calls (latency)
# each at 2 threads, then at 1; every tool loads the model once, warms up,
# and reports the median of its timed calls. PRECISIONS (default "fp32")
# lists the qkv precisions to run, THREADS (default "2 1") the thread
# counts, WORKLOADS (default "a b c") the workloads. ROUNDS (default 1):
# with R > 1 the tools take turns R times (one timed call each for A and B,
# 200 calls for C), so a noisy stretch of a shared machine hits them all
# alike, and a last "summary" line per tool gives the median of its rounds.
#
#   bench/encoder_vs_peers.sh VENV SCRATCH [BUILD_DIR]
# after bench/encoder_peers_setup.sh VENV SCRATCH.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: encoder_vs_peers.sh VENV SCRATCH [BUILD_DIR]}
scratch=${2:?usage: encoder_vs_peers.sh VENV SCRATCH [BUILD_DIR]}
build=${3:-$here/build}
model=$here/models/all-MiniLM-L6-v2
py="$venv/bin/python $here/bench/encoder_peers.py run --model $model --onnx $scratch"
rounds=${ROUNDS:-1}
reps=3
[ "$rounds" -gt 1 ] && reps=1
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
export OMP_WAIT_POLICY=PASSIVE
for t in ${THREADS:-2 1}; do
    for w in ${WORKLOADS:-a b c}; do
        if [ $w = c ]; then mode="--latency --reps 200"; else mode="--reps $reps"; fi
        r=0
        while [ $r -lt "$rounds" ]; do
            r=$((r + 1))
            for p in ${PRECISIONS:-fp32}; do
                "$build/bench/bench_encoder" --model "$model" --input "$scratch/$w.txt" --threads $t $mode \
                    --precision $p --label "qkv-$p" | sed "s/^/workload=$w round=$r /" | tee -a "$lines"
            done
            for peer in st ort ort-int8; do
                $py --peer $peer --input "$scratch/$w.txt" --threads $t $mode | grep '^peer=' |
                    sed "s/^/workload=$w round=$r /" | tee -a "$lines"
            done
        done
    done
done
if [ "$rounds" -gt 1 ]; then
    # the median over the rounds of each tool's time (median_s, or median_ms for C)
    awk '{
        w = ""; p = ""; t = ""; v = "";
        for (i = 1; i <= NF; i++) {
            split($i, kv, "=");
            if (kv[1] == "workload") w = kv[2];
            else if (kv[1] == "peer") p = kv[2];
            else if (kv[1] == "threads") t = kv[2];
            else if (kv[1] == "median_s" || kv[1] == "median_ms") { v = kv[2]; u = kv[1] }
        }
        if (v == "") next;
        k = w " " t " " p " " u; n[k]++; val[k, n[k]] = v; if (!(k in seen)) { seen[k] = 1; order[++m] = k }
    } END {
        for (j = 1; j <= m; j++) {
            k = order[j]; c = n[k];
            for (a = 1; a <= c; a++) x[a] = val[k, a] + 0;
            for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (x[b] < x[a]) { y = x[a]; x[a] = x[b]; x[b] = y }
            med = c % 2 ? x[(c + 1) / 2] : (x[c / 2] + x[c / 2 + 1]) / 2;
            split(k, f, " ");
            printf "summary workload=%s threads=%s peer=%s rounds=%d %s=%.3f\n", f[1], f[2], f[3], c, f[4], med
        }
    }' "$lines"
fi
