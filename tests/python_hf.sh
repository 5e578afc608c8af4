#!/usr/bin/env bash
# qkv.hf (python/qkv/hf.py) against Hugging Face transformers: makes a venv
# that sees the system's PyTorch and NumPy (--system-site-packages), pip
# installs the pinned transformers into it (needs the network: about 10 s,
# 160 MB with its dependencies), and runs python/tests/test_hf.py on the
# source tree's python/qkv with the library $QKV_LIBRARY (default
# build/libqkv.so, the README build).
#
# transformers 4.49.0 is the newest that runs on torch 1.13 (Debian 12's
# python3-torch): 4.50 and 4.51 import torch.distributed.tensor (torch 2.x),
# 4.52 on require torch >= 2.1.
#
# Usage: tests/python_hf.sh [PYTHON]   (default /usr/bin/python3, else python3)
# Needs: PYTHON with venv, ensurepip, NumPy and PyTorch (Debian: apt-get
# install python3-venv python3-numpy python3-torch), and build/libqkv.so
# (cmake -S . -B build && cmake --build build -j2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
transformers_version=4.49.0
py=${1:-}
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
fail() { echo "python_hf: $*" >&2; exit 1; }

for m in venv ensurepip numpy torch; do
  "$py" -c "import $m" 2>/dev/null ||
    fail "$py has no module '$m' (Debian: apt-get install python3-venv python3-numpy python3-torch)"
done
lib=${QKV_LIBRARY:-$root/build/libqkv.so}
[ -f "$lib" ] || fail "no $lib: build it (cmake -S . -B build && cmake --build build -j2) or set QKV_LIBRARY"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qkv-python-hf.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv --system-site-packages "$tmp/venv"
vpy="$tmp/venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
echo "python_hf: pip install transformers==$transformers_version"
start=$(date +%s)
"$vpy" -m pip install "transformers==$transformers_version" >"$tmp/install.log" 2>&1 ||
  { tail -n 20 "$tmp/install.log" >&2; fail "pip install transformers==$transformers_version failed (it needs the network)"; }
echo "python_hf: installed in $(( $(date +%s) - start )) s"

cd "$root"
PYTHONPATH="$root/python" QKV_LIBRARY="$lib" "$vpy" python/tests/test_hf.py
echo "python_hf: passed"
