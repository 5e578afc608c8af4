#!/usr/bin/env bash
# `qkv demo`: trains its model and walks "Hello , I love you !" through it.
# Checks the printed steps, that A' agrees with the model's own attention,
# the pictures (PNG signature; without PNG: none, said once), the terminal
# colours on demand, the pretrained-model step on the tiny test model (and
# its hint when there is no model), and the errors (usage: exit 2; an
# unusable --out or a missing --model: exit 1 and no picture left).
# Usage: demo_cli.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init demo_cli "$@"
# No pretrained model unless --model names one (not even one that happens
# to lie in models/ of the folder the test runs in).
export QKV_MODEL_DIR=$TMP/no-model

# A full run into a new folder.
"$QKV" demo --out "$TMP/out" --color never >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
[ "$rc" -eq 0 ] && pass || fail "demo exit $rc: $(cat "$TMP/stderr")"
[ -z "$(grep -v "pictures not drawn" "$TMP/stderr")" ] && pass || fail "demo wrote to stderr: $(cat "$TMP/stderr")"
pictures=(attention.png attention_head0.png attention_head1.png attention_heads.png attention_window.png loss.png
          positional_encoding.png)
pictures "$TMP/stderr" "${pictures[@]/#/$TMP/out/}"
for f in "${pictures[@]}"; do
    if with_png; then
        grep -q "wrote $TMP/out/$f" "$TMP/stdout" && pass || fail "path of $f not printed"
    else
        grep -q "wrote " "$TMP/stdout" && fail "'wrote' printed without PNG" || pass
    fi
done
# No pretrained model: one line says how to get it, and the demo succeeds.
[ "$(grep -c "run scripts/fetch-model.sh, then the demo again" "$TMP/stdout")" -eq 1 ] \
    && grep -q "$TMP/no-model" "$TMP/stdout" && pass || fail "no hint for the missing model: $(tail -2 "$TMP/stdout")"
for step in "    I  \[6 x 8\]" "    q  \[6 x 4\]" "    k  \[6 x 4\]" "    v  \[6 x 4\]" "    A  \[6 x 6\]" \
            "    A'  \[6 x 6\]" "    O  \[6 x 4\]" "    y  \[6 x 8\]" "A' (window 2)"; do
    grep -q "$step" "$TMP/stdout" && pass || fail "step not printed: $step"
done
# The hand computation agrees with the model and with qkv_mha_forward.
while read -r d; do
    awk -v d="$d" 'BEGIN { exit !(d + 0 < 1e-4) }' && pass || fail "difference $d too large"
done < <(grep -o "difference [0-9.e+-]*" "$TMP/stdout" | awk '{print $2}')
[ "$(grep -c "difference" "$TMP/stdout")" -eq 2 ] && pass || fail "two agreement checks expected"
# The model learned the corpus: after "Hello" comes ",", after "," comes "I", after "love" comes "you".
grep -q "Hello -> , (" "$TMP/stdout" && grep -q ", -> I (" "$TMP/stdout" && grep -q "love -> you (" "$TMP/stdout" \
    && pass || fail "predictions: $(grep -- '->' "$TMP/stdout" | head -3)"
# No colour codes when not asked; colours with --color always.
grep -q $'\x1b\\[' "$TMP/stdout" && fail "escape codes with --color never" || pass
"$QKV" demo --out "$TMP/out" --color always --steps 20 >"$TMP/stdout2" 2>&1
[ $? -eq 0 ] && grep -q $'\x1b\\[48;' "$TMP/stdout2" && pass || fail "no colours with --color always"
# Same seed, same numbers.
"$QKV" demo --out "$TMP/out" --color never >"$TMP/stdout3" 2>"$TMP/stderr3"
cmp -s <(grep -v " s. The best" "$TMP/stdout") <(grep -v " s. The best" "$TMP/stdout3") && pass || fail "two runs with the same seed differ"

# Usage errors: exit 2, nothing written.
expect_usage() {
    "$QKV" demo "$@" >"$TMP/o" 2>"$TMP/e"
    local rc=$?
    [ "$rc" -eq 2 ] && grep -q "^qkv demo: " "$TMP/e" && pass || fail "demo $*: exit $rc, stderr $(cat "$TMP/e")"
}
expect_usage --color sometimes
expect_usage --steps 0
expect_usage --seed -1
expect_usage --bogus
expect_usage --out ""
expect_usage stray
# --out names a file: exit 1, message naming it.
touch "$TMP/file"
"$QKV" demo --out "$TMP/file" >"$TMP/o" 2>"$TMP/e"
rc=$?
[ "$rc" -eq 1 ] && grep -q "$TMP/file" "$TMP/e" && pass || fail "--out FILE: exit $rc, $(cat "$TMP/e")"
# A picture that cannot be written (a folder in its place): exit 1, and the
# pictures written before it are removed again.
if with_png; then
    mkdir -p "$TMP/blk/attention_window.png"
    "$QKV" demo --out "$TMP/blk" --steps 5 >"$TMP/o" 2>"$TMP/e"
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "attention_window.png" "$TMP/e" && [ "$(ls -A "$TMP/blk")" = "attention_window.png" ] \
        && pass || fail "failed write: exit $rc, left $(ls -A "$TMP/blk" | tr '\n' ' ')"
fi
# An unwritable folder: exit 1, no picture left behind.
if with_png && [ "$(id -u)" -ne 0 ]; then
    mkdir "$TMP/ro" && chmod 555 "$TMP/ro"
    "$QKV" demo --out "$TMP/ro" --steps 5 >"$TMP/o" 2>"$TMP/e"
    rc=$?
    [ "$rc" -eq 1 ] && [ -z "$(ls -A "$TMP/ro")" ] && pass || fail "read-only --out: exit $rc"
    chmod 755 "$TMP/ro"
fi
"$QKV" demo --help | grep -q "^Usage: qkv demo" && pass || fail "--help"

# The pretrained-model step, on the tiny test model: its word pieces, one
# head's attention (and its picture), the sentences' cosine similarities.
TINY=$ROOT/tests/data/encoder/tiny
"$QKV" demo --out "$TMP/model" --steps 5 --color never --model "$TINY" >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
[ "$rc" -eq 0 ] && pass || fail "demo --model: exit $rc"
grep -q "^9\. The same on a pretrained sentence encoder" "$TMP/stdout" && pass || fail "no step 9 with --model"
grep -A1 "in the model's word pieces" "$TMP/stdout" | grep -q "^ *\[CLS\] hello , i love you ! \[SEP\]$" && pass \
    || fail "word pieces: $(grep -A1 "word pieces" "$TMP/stdout")"
grep -Eq "hardest at another word is layer [0-1], head [0-3]:" "$TMP/stdout" && pass || fail "no head chosen"
grep -q "     \[SEP\] " "$TMP/stdout" && pass || fail "the head's attention matrix not printed"
[ "$(grep -cE '^ +-?[01]\.[0-9]{2}  "' "$TMP/stdout")" -eq 3 ] && pass || fail "three cosine similarities expected"
grep -q "fetch-model.sh" "$TMP/stdout" && fail "the hint printed although --model was given" || pass
pictures "$TMP/stderr" "$TMP/model/attention_model.png"
# The coloured heatmap of the head, on demand.
"$QKV" demo --out "$TMP/model" --steps 5 --color always --model "$TINY" >"$TMP/stdout2" 2>&1
[ $? -eq 0 ] && sed -n '/^9\./,$p' "$TMP/stdout2" | grep -q $'\x1b\\[48;' && pass || fail "no coloured head with --color always"
# A --model that is not there: exit 1, the message names it, nothing written.
"$QKV" demo --out "$TMP/nomodel" --steps 5 --model "$TMP/missing" >"$TMP/o" 2>"$TMP/e"
rc=$?
[ "$rc" -eq 1 ] && grep -q -- "--model $TMP/missing" "$TMP/e" && [ -z "$(ls -A "$TMP/nomodel" 2>/dev/null)" ] \
    && pass || fail "missing --model: exit $rc, $(cat "$TMP/e")"
# A model folder that cannot be loaded: exit 1, and the pictures are removed.
mkdir -p "$TMP/broken"
"$QKV" demo --out "$TMP/brk" --steps 5 --model "$TMP/broken" >"$TMP/o" 2>"$TMP/e"
rc=$?
[ "$rc" -eq 1 ] && grep -q -- "--model $TMP/broken" "$TMP/e" && [ -z "$(ls -A "$TMP/brk")" ] \
    && pass || fail "broken --model: exit $rc, left $(ls -A "$TMP/brk" | tr '\n' ' '), $(cat "$TMP/e")"

cli_finish demo_cli
