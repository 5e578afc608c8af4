#!/usr/bin/env bash
# `qkv show`: draws every layer's and head's attention of a checkpoint that
# `qkv train` wrote, for integer tokens (copy) and bytes (text); errors exit
# 2 (usage) or 1 (bad checkpoint or input, failed write; no picture left).
# Usage: demo_show.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init demo_show "$@"

# Two small checkpoints (a few steps: only the format matters here).
"$QKV" train --task copy --seq 4 --layers 2 --dim 16 --heads 2 --steps 5 --threads 1 --quiet \
    --out "$TMP/copy" >/dev/null 2>"$TMP/e" || { fail "train copy: $(cat "$TMP/e")"; }
printf 'hello world, self-attention is all you need.\n%.0s' 1 2 3 4 5 6 7 8 > "$TMP/corpus.txt"
"$QKV" train --task text "$TMP/corpus.txt" --seq 16 --layers 1 --dim 16 --heads 2 --steps 5 --threads 1 --quiet \
    --out "$TMP/text" >/dev/null 2>"$TMP/e" || { fail "train text: $(cat "$TMP/e")"; }

# Integer tokens: 2 layers x 2 heads -> four pictures in the checkpoint folder.
"$QKV" show --ckpt "$TMP/copy" --text "3 1 4 1" --color never >"$TMP/o" 2>"$TMP/e"
rc=$?
[ "$rc" -eq 0 ] && [ ! -s "$TMP/e" ] && pass || fail "show copy: exit $rc, $(cat "$TMP/e")"
for l in 0 1; do
    for h in 0 1; do
        f="$TMP/copy/show_l${l}_h${h}.png"
        [ -f "$f" ] && is_png "$f" && grep -q "wrote $f" "$TMP/o" && pass || fail "missing $f"
    done
done
grep -q "2 layers x 2 heads, decoder (causal), 4 tokens, task copy" "$TMP/o" && pass || fail "summary: $(head -1 "$TMP/o")"
grep -q $'\x1b\\[' "$TMP/o" && fail "escape codes with --color never" || pass

# Bytes, elsewhere, with the terminal heatmaps forced.
"$QKV" show --ckpt "$TMP/text" --text "hello world" --out "$TMP/pics" --color always >"$TMP/o" 2>"$TMP/e"
rc=$?
[ "$rc" -eq 0 ] && pass || fail "show text: exit $rc, $(cat "$TMP/e")"
[ -f "$TMP/pics/show_l0_h0.png" ] && [ -f "$TMP/pics/show_l0_h1.png" ] && pass || fail "text pictures"
grep -q "11 tokens, task text" "$TMP/o" && pass || fail "11 byte tokens"
grep -q $'\x1b\\[48;2;' "$TMP/o" && grep -q "layer 0, head 1" "$TMP/o" && grep -q "h   e   l   l   o   _" "$TMP/o" \
    && pass || fail "terminal heatmap with byte labels"
# The same text read as integers is an error; integers beyond the vocabulary too.
expect_fail() {
    local want=$1
    shift
    "$QKV" show "$@" >"$TMP/o" 2>"$TMP/e"
    local rc=$?
    [ "$rc" -eq "$want" ] && grep -q "^qkv show: " "$TMP/e" && pass || fail "show $*: exit $rc (want $want), $(cat "$TMP/e")"
}
expect_fail 1 --ckpt "$TMP/text" --text "hello" --tokens ints --out "$TMP/x"
expect_fail 1 --ckpt "$TMP/copy" --text "3 1 99999" --out "$TMP/x"
expect_fail 1 --ckpt "$TMP/copy" --text "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20" --out "$TMP/x"
expect_fail 1 --ckpt "$TMP/copy" --text "1" --tokens bytes --out "$TMP/x"
expect_fail 1 --ckpt "$TMP/nothing" --text "1 2" --out "$TMP/x"
[ ! -e "$TMP/x" ] && pass || fail "a failed show created its output folder"
expect_fail 2 --text "1 2"
expect_fail 2 --ckpt "$TMP/copy"
expect_fail 2 --ckpt "$TMP/copy" --text ""
expect_fail 2 --ckpt "$TMP/copy" --text "1" --tokens words
expect_fail 2 --ckpt "$TMP/copy" --text "1" --color maybe
expect_fail 2 --ckpt "$TMP/copy" --text "1" --bogus
# A picture that cannot be written: exit 1, the ones before it removed.
mkdir -p "$TMP/blk/show_l1_h0.png"
expect_fail 1 --ckpt "$TMP/copy" --text "3 1 4 1" --out "$TMP/blk"
[ "$(ls -A "$TMP/blk")" = "show_l1_h0.png" ] && pass || fail "left behind: $(ls -A "$TMP/blk" | tr '\n' ' ')"
"$QKV" show --help | grep -q "^Usage: qkv show" && pass || fail "--help"

cli_finish demo_show
