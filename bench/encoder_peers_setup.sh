#!/bin/sh
# The peers of bench_encoder in a virtual environment outside the repository,
# pinned: PyTorch and sentence-transformers, ONNX Runtime with its BERT
# optimizer and quantiser; then the ONNX files of the model in a scratch
# folder (never committed). bench/encoder_vs_peers.sh runs them.
#
#   bench/encoder_peers_setup.sh VENV SCRATCH [MODEL_DIR]
# MODEL_DIR defaults to models/all-MiniLM-L6-v2 (scripts/fetch-model.sh).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: encoder_peers_setup.sh VENV SCRATCH [MODEL_DIR]}
scratch=${2:?usage: encoder_peers_setup.sh VENV SCRATCH [MODEL_DIR]}
model=${3:-$here/models/all-MiniLM-L6-v2}
for d in "$venv" "$scratch"; do
    case "$(cd "$(dirname "$d")" 2>/dev/null && pwd)/$(basename "$d")/" in
    "$here"/*) echo "encoder_peers_setup.sh: $d is inside the repository; put it elsewhere" >&2; exit 2 ;;
    esac
done
[ -f "$model/config.json" ] || { echo "encoder_peers_setup.sh: no model in $model (run scripts/fetch-model.sh)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet torch==2.15.0 transformers==5.24.0 sentence-transformers==6.2.0 \
    onnxruntime==1.31.1 onnx==1.23.2 numpy
mkdir -p "$scratch"
"$venv/bin/python" "$here/bench/encoder_peers.py" export --model "$model" --out "$scratch"
python3 "$here/bench/make_encoder_texts.py" "$model/vocab.txt" "$scratch"
echo "peers in $venv, ONNX files and workloads in $scratch"
