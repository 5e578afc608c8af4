#!/usr/bin/env bash
# `qkv image`: successful runs (full, windowed, positional, projected) and
# failing ones (exit 2 for usage errors, 1 for bad files; a message naming the
# option or file; nothing on stdout; no output or temporary file left).
# Usage: image_cli.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init image_cli "$@"
IMG=$ROOT/tests/data/image
n=0

# ok NEEDLE ARGS...: exit 0, stdout contains NEEDLE, the PNG exists and is a PNG.
ok() {
    local needle=$1
    shift
    n=$((n + 1))
    local out="$TMP/ok$n"
    mkdir -p "$out"
    local args=() a
    for a in "$@"; do args+=("${a//@O@/$out}"); done
    "$QKV" image "${args[@]}" >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$?
    if [ $rc -ne 0 ]; then fail "ok $n (${args[*]}): exit $rc"; return; fi
    if ! grep -qF -- "$needle" "$TMP/stdout"; then fail "ok $n: stdout lacks '$needle': $(cat "$TMP/stdout")"; return; fi
    if [ "$(head -c 4 "$out/map.png" | od -An -tx1 | tr -d ' ')" != "89504e47" ]; then fail "ok $n: map.png is not a PNG"; return; fi
    if [ -n "$(ls -A "$out" | grep -v -e '^map.png$' -e '^row.npy$')" ]; then fail "ok $n: stray files: $(ls -A "$out")"; return; fi
    passed=$((passed + 1))
}

expect() {
    local want=$1 needle=$2
    shift 2
    n=$((n + 1))
    local out="$TMP/out$n"
    mkdir -p "$out"
    local args=() a
    for a in "$@"; do args+=("${a//@O@/$out}"); done
    "$QKV" image "${args[@]}" >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "case $n (${args[*]}): exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/stderr"; then fail "case $n: stderr lacks '$needle'"
    elif [ -s "$TMP/stdout" ]; then fail "case $n: unexpected stdout"
    elif [ -n "$(ls -A "$out")" ]; then fail "case $n: left behind: $(ls -A "$out")"
    else passed=$((passed + 1)); fi
}

S=$IMG/scene.png   # 24 x 16 RGB
ok "384 keys" "$S" --query 16,6 -o @O@/map.png --attn @O@/row.npy
# The .npy is [16, 24] float32: a 128-byte header and 384 * 4 bytes.
if [ "$(stat -c %s "$TMP/ok1/row.npy")" -eq $((128 + 384 * 4)) ]; then passed=$((passed + 1)); else fail "row.npy size"; fi
# Inside the uniform bright square a 5 x 5 window is uniform: 1/25 each.
ok "25 keys (window), max weight 0.04 " "$S" --query 16,6 --window 5 -o @O@/map.png
ok "9 keys (window)" "$S" --query 0,0 --window 5 -o @O@/map.png   # a corner: 3 x 3 of the window
ok "384 keys" --in "$S" --query 23,15 --pos sinusoidal2d --scale 4 -o @O@/map.png
ok "384 keys" "$S" --query 3,3 --dim 8 --seed 5 --out=@O@/map.png
ok "15 keys" "$IMG/palette.png" --query 4,2 -o @O@/map.png
ok "15 keys" "$IMG/gray16.pgm" --query 0,0 --window 99 -o @O@/map.png
"$QKV" image --help >/dev/null 2>&1 && passed=$((passed + 1)) || fail "--help"

expect 2 "Usage: qkv image" # bare: synopsis
expect 2 "missing --query" "$S" -o @O@/map.png
expect 2 "missing -o" "$S" --query 1,1
expect 2 "--query" "$S" --query 1 -o @O@/map.png
expect 2 "outside the 24 x 16 image" "$S" --query 24,0 -o @O@/map.png
expect 2 "--window" "$S" --query 1,1 --window 4 -o @O@/map.png
expect 2 "--pos" "$S" --query 1,1 --pos learned -o @O@/map.png
expect 2 "multiple of 4" "$S" --query 1,1 --pos sinusoidal2d --dim 6 -o @O@/map.png
expect 2 "--scale" "$S" --query 1,1 --scale 0 -o @O@/map.png
expect 2 "same file" "$S" --query 1,1 -o @O@/x --attn @O@/x
expect 2 "--bogus" "$S" --query 1,1 --bogus -o @O@/map.png
expect 1 "$TMP/nonexistent.png" "$TMP/nonexistent.png" --query 1,1 -o @O@/map.png
head -c 60 "$S" >"$TMP/trunc.png"
expect 1 "$TMP/trunc.png" "$TMP/trunc.png" --query 1,1 -o @O@/map.png
printf 'P6\n100000 100000\n255\n\001' >"$TMP/lie.ppm"
expect 1 "truncated" "$TMP/lie.ppm" --query 1,1 -o @O@/map.png
expect 1 "$ROOT/README.md" "$ROOT/README.md" --query 1,1 -o @O@/map.png
# A failing PNG write removes the .npy already written.
expect 1 "$TMP/no/such/dir/map.png" "$S" --query 1,1 --attn @O@/row.npy -o "$TMP/no/such/dir/map.png"

cli_finish
