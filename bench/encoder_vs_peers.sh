#!/bin/sh
# qkv's encoder beside sentence-transformers and ONNX Runtime in one run, on
# the workloads of make_encoder_texts.py (docs/BENCHMARKS.md, "Encoders"):
#   A  2,048 short sentences, the whole file in one call (throughput)
#   B  256 texts of 256 tokens (throughput)
#   C  one 10-token sentence per call, 200 calls (latency)
# each at 2 threads, then at 1; every tool loads the model once, warms up,
# and reports the median of its timed calls. PRECISIONS (default "fp32")
# lists the qkv precisions to run, THREADS (default "2 1") the thread counts.
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
export OMP_WAIT_POLICY=PASSIVE
for t in ${THREADS:-2 1}; do
    for w in a b c; do
        if [ $w = c ]; then mode="--latency --reps 200"; else mode="--reps 3"; fi
        for p in ${PRECISIONS:-fp32}; do
            "$build/bench/bench_encoder" --model "$model" --input "$scratch/$w.txt" --threads $t $mode \
                --precision $p --label "qkv-$p" | sed "s/^/workload=$w /"
        done
        for peer in st ort ort-int8; do
            $py --peer $peer --input "$scratch/$w.txt" --threads $t $mode | sed "s/^/workload=$w /"
        done
    done
done
