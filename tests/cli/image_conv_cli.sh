#!/usr/bin/env bash
# `qkv conv-as-attention`: successful runs (output shape, --check within
# float32 rounding at the default alpha, --sweep) and failing ones (exit 2
# usage, 1 bad files; the message names the option and file; nothing on
# stdout; no output file left behind).
# Usage: image_conv_cli.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init image_conv_cli "$@"
D=$ROOT/tests/data/image/conv
n=0

run() { "$QKV" conv-as-attention "$@" >"$TMP/stdout" 2>"$TMP/stderr"; }

# y [4, 10, 12] float32: the .npy header says so; --check prints a tiny error.
run --kernel "$D/w3.npy" --bias "$D/b4.npy" --image "$D/x3.npy" -o "$TMP/y.npy" --check
rc=$?
if [ $rc -eq 0 ] && head -c 128 "$TMP/y.npy" | grep -qF "'shape': (4, 10, 12)" && head -c 128 "$TMP/y.npy" | grep -qF "<f4"; then pass; else fail "w3 run: exit $rc"; fi
# The error at alpha 100 is float32 rounding: an exponent of e-06 or smaller.
if grep -qE "alpha 100: max \|attention - conv\| = [0-9.]+e-(0[6-9]|[1-9][0-9])" "$TMP/stdout"; then pass; else fail "--check: $(cat "$TMP/stdout")"; fi
run --kernel "$D/w5.npy" --image "$D/x3_f64.npy" --alpha 3 --out="$TMP/y5.npy"
if [ $? -eq 0 ] && head -c 128 "$TMP/y5.npy" | grep -qF "'shape': (2, 7, 5)" && [ ! -s "$TMP/stdout" ]; then pass; else fail "w5 f64 run"; fi
run --kernel "$D/w3.npy" --image "$D/x3.npy" --sweep
if [ $? -eq 0 ] && [ "$(grep -c '^ *[0-9.e+]* *[0-9.]*e[-+][0-9]* *[0-9.]*e[-+][0-9]*$' "$TMP/stdout")" -eq 12 ]; then pass; else fail "--sweep: $(cat "$TMP/stdout")"; fi
"$QKV" conv-as-attention --help | grep -qF "Cordonnier" && pass || fail "--help"

expect() {
    local want=$1 needle=$2
    shift 2
    n=$((n + 1))
    local out="$TMP/e$n"
    mkdir -p "$out"
    run "$@" -o "$out/y.npy"
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "case $n ($*): exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/stderr"; then fail "case $n: stderr lacks '$needle'"
    elif [ -s "$TMP/stdout" ]; then fail "case $n: unexpected stdout"
    elif [ -n "$(ls -A "$out")" ]; then fail "case $n: left behind: $(ls -A "$out")"
    else pass; fi
}
expect 2 "missing --kernel" --image "$D/x3.npy"
expect 2 "missing --image" --kernel "$D/w3.npy"
expect 2 "--alpha" --kernel "$D/w3.npy" --image "$D/x3.npy" --alpha 0
expect 2 "--alpha" --kernel "$D/w3.npy" --image "$D/x3.npy" --alpha inf
expect 2 "--alpha" --kernel "$D/w3.npy" --image "$D/x3.npy" --alpha abc
expect 2 "--sweep" --kernel "$D/w3.npy" --image "$D/x3.npy" --sweep
expect 2 "--nope" --kernel "$D/w3.npy" --image "$D/x3.npy" --nope
expect 1 "--kernel $D/w_even.npy" --kernel "$D/w_even.npy" --image "$D/x3.npy"
expect 1 "--image $D/x2.npy: shape [2, 6, 6] has 2 channels" --kernel "$D/w3.npy" --image "$D/x2.npy"
expect 1 "--bias $D/b4.npy" --kernel "$D/w5.npy" --bias "$D/b4.npy" --image "$D/x3.npy"
expect 1 "--image $D/i32.npy: dtype int32" --kernel "$D/w3.npy" --image "$D/i32.npy"
expect 1 "--kernel $D/x3.npy: shape [3, 10, 12]" --kernel "$D/x3.npy" --image "$D/x3.npy"
expect 1 "--image $TMP/none.npy" --kernel "$D/w3.npy" --image "$TMP/none.npy"
head -c 100 "$D/x3.npy" >"$TMP/trunc.npy"
expect 1 "--image $TMP/trunc.npy" --kernel "$D/w3.npy" --image "$TMP/trunc.npy"
# An unwritable output.
run --kernel "$D/w3.npy" --image "$D/x3.npy" -o "$TMP/no/dir/y.npy"
if [ $? -eq 1 ] && grep -qF -- "-o $TMP/no/dir/y.npy" "$TMP/stderr"; then pass; else fail "unwritable -o"; fi

cli_finish
