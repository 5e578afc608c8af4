#!/usr/bin/env bash
# `qkv complexity --quick`: the table is printed, the path lengths that do
# not depend on timing are exact (self-attention 1; contiguous convolution
# and RNN n - 1; dilated convolution log_3(2n - 1); restricted attention
# ceil((n - 1) / (R/2))), the PNG is written; usage errors exit 2, an
# unwritable PNG exits 1 and leaves nothing behind; without PNG, --png is a
# usage error.
# Usage: complexity_cli.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init complexity_cli "$@"

# The plot is asked for only where this qkv draws (without PNG, --png is a
# usage error: checked below).
png=()
if with_png; then png=(--png "$TMP/plot.png"); fi
"$QKV" complexity --quick "${png[@]}" >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 0 ] && pass || { fail "quick run: exit $rc"; cat "$TMP/err" >&2; }
row() { sed -n '/^maximum path length/,/^$/p' "$TMP/out" | grep -E "^$1 " | head -1 | tr -s ' '; }
# n = 5 14 41 122 365 (K = 3: n = (3^j + 1) / 2)
[ "$(row n)" = "n 5 14 41 122 365" ] && pass || fail "path n row: $(row n)"
[ "$(row self-attention)" = "self-attention 1 1 1 1 1" ] && pass || fail "attention path: $(row self-attention)"
[ "$(row 'restricted self-attn')" = "restricted self-attn 1 1 3 8 23" ] && pass || fail "restricted path: $(row 'restricted self-attn')"
[ "$(row 'recurrent \(Elman RNN\)')" = "recurrent (Elman RNN) 4 13 40 121 364" ] && pass || fail "rnn path: $(row 'recurrent \(Elman RNN\)')"
[ "$(row 'conv, contiguous')" = "conv, contiguous 4 13 40 121 364" ] && pass || fail "conv path: $(row 'conv, contiguous')"
[ "$(row 'conv, dilated K\^l')" = "conv, dilated K^l 2 3 4 5 6" ] && pass || fail "dilated path: $(row 'conv, dilated K\^l')"
for l in "self-attention         | O(n^2 d)" "recurrent (LSTM)       | O(n d^2)" "convolutional          | O(k n d^2)"; do
    grep -qF -- "$l" "$TMP/out" && pass || fail "table row '$l'"
done
# The RNN's 2-thread schedule needs one round per step (n = 256 in --quick).
grep -E "^recurrent \(Elman RNN\) +\|" "$TMP/out" | grep -qE " 256 \([0-9.]+x\)" && pass || fail "rnn rounds: $(grep -E '^recurrent \(Elman RNN\) +\|' "$TMP/out")"
if with_png; then
    [ "$(head -c 4 "$TMP/plot.png" | od -An -tx1 | tr -d ' ')" = "89504e47" ] && pass || fail "plot.png is not a PNG"
fi

expect() {
    local want=$1 needle=$2
    shift 2
    "$QKV" complexity "$@" >"$TMP/o2" 2>"$TMP/e2"
    local rc=$?
    if [ $rc -ne "$want" ]; then fail "($*): exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/e2"; then fail "($*): stderr lacks '$needle': $(cat "$TMP/e2")"
    else pass; fi
}
expect 2 "--kernel" --kernel 4
expect 2 "--window" --window 3
expect 2 "--max-n" --max-n 10
expect 2 "--d" --d 0
expect 2 "--bogus" --bogus
if with_png; then
    mkdir -p "$TMP/ro"
    expect 1 "--png $TMP/no/dir/p.png" --quick --png "$TMP/no/dir/p.png"
    [ -z "$(ls -A "$TMP/ro")" ] && pass || fail "left files"
else
    # --png in a build without PNG: refused before anything is measured.
    expect 2 "--png: this qkv was built without PNG" --quick --png "$TMP/p.png"
    [ ! -e "$TMP/p.png" ] && [ ! -s "$TMP/o2" ] && pass || fail "--png without PNG: output left"
fi

cli_finish
