#!/usr/bin/env bash
# `qkv show --model`: a pretrained encoder's attention (the tiny BERT of
# tests/data/encoder/tiny: 2 layers x 4 heads) drawn as a grid, per layer
# and as one map, and written with --npy: the maps equal transformers'
# (tests/data/encoder/expected_attention_s0.npy, from make_attention.py) and
# every row sums to 1. Bad input exits 2 (usage) or 1, leaving nothing.
# Usage: show_model.sh QKV_BINARY REPO_ROOT   (needs bash, coreutils, awk)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init show_model "$@"
MODEL=$ROOT/tests/data/encoder/tiny
EXPECTED=$ROOT/tests/data/encoder/expected_attention_s0.npy
TEXT="Hello, I love you!"
[ -f "$MODEL/model.safetensors" ] && [ -f "$EXPECTED" ] ||
    fail "the tiny model or its expected maps are missing (tests/data/encoder/make_tiny.py, make_attention.py)"

# png_size FILE: "WIDTH HEIGHT" from the PNG's IHDR (big-endian at bytes 16..23).
png_size() {
    local b
    b=($(od -An -tu1 -j16 -N8 "$1"))
    echo $(((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3])) $(((b[4] << 24) | (b[5] << 16) | (b[6] << 8) | b[7]))
}

# picture FILE MIN_W MIN_H MAX_W MAX_H: a PNG whose size lies in the bounds.
picture() {
    local f=$1 w h
    if [ ! -f "$f" ] || ! is_png "$f"; then
        fail "$f: not a PNG"
        return
    fi
    read -r w h < <(png_size "$f")
    [ "$w" -ge "$2" ] && [ "$h" -ge "$3" ] && [ "$w" -le "$4" ] && [ "$h" -le "$5" ] && pass ||
        fail "$f: ${w}x$h, want $2..$4 x $3..$5"
}

# npy_values FILE TYPE: the values of a .npy (od type f4 or f8), one a line.
npy_values() {
    local b
    b=($(od -An -tu1 -j8 -N2 "$1")) # the header's length, little-endian
    od -An -v -t"$2" -j$((10 + b[0] + 256 * b[1])) "$1" | tr -s ' ' '\n' | sed '/^$/d'
}

# The grid and every layer, in a new folder; every file named on stdout.
run show --model "$MODEL" --text "$TEXT" --out "$TMP/pics" --npy "$TMP/maps.npy" --color never
[ "$rc" -eq 0 ] && [ ! -s "$TMP/stderr" ] && pass || fail "show --model: exit $rc"
grep -q "2 layers x 4 heads, 8 word pieces: \[CLS\] hello , i love you ! \[SEP\]$" "$TMP/stdout" && pass ||
    fail "summary: $(head -1 "$TMP/stdout")"
for f in pics/show_layers.png pics/show_l0.png pics/show_l1.png maps.npy; do
    grep -qx "wrote $TMP/$f" "$TMP/stdout" && pass || fail "no 'wrote $TMP/$f'"
done
[ "$(ls "$TMP/pics" | tr '\n' ' ')" = "show_l0.png show_l1.png show_layers.png " ] && pass ||
    fail "pictures: $(ls "$TMP/pics" | tr '\n' ' ')"
# Grid: 4 heads of 8 x 16-pixel cells across, 2 layers of 9 rows down;
# a layer: 4 heads of 8 x 30 pixels; plus labels, titles and the colour bar.
picture "$TMP/pics/show_layers.png" 512 288 1200 700
picture "$TMP/pics/show_l0.png" 960 240 1800 600
picture "$TMP/pics/show_l1.png" 960 240 1800 600

# The maps: float32 [layers, heads, n, n], rows summing to 1, equal to
# transformers' float64 maps within 1e-5.
npy "$TMP/maps.npy" '<f4' '(2,4,8,8)'
npy_values "$TMP/maps.npy" f4 >"$TMP/got"
npy_values "$EXPECTED" f8 >"$TMP/want"
[ "$(wc -l <"$TMP/got")" -eq 512 ] && [ "$(wc -l <"$TMP/want")" -eq 512 ] && pass || fail "512 values each"
paste "$TMP/got" "$TMP/want" | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > worst) worst = d; sum += $1 }
    NR % 8 == 0 { r = sum - 1; if (r < 0) r = -r; if (r > row) row = r; sum = 0 }
    END { printf "%g %g\n", worst, row; exit !(NR == 512 && worst <= 1e-5 && row <= 1e-5) }' >"$TMP/err"
check $? "maps against transformers (max difference, row sum error): $(cat "$TMP/err")"

# --layer: that layer alone; --layer --head: one large map (8 cells of 48
# pixels), coloured on the terminal when asked.
run show --model "$MODEL" --text "$TEXT" --out "$TMP/one" --layer 1 --color never
[ "$rc" -eq 0 ] && [ "$(ls "$TMP/one")" = "show_l1.png" ] && pass || fail "--layer 1: exit $rc, $(ls "$TMP/one")"
run show --model "$MODEL" --text "$TEXT" --out "$TMP/head" --layer 1 --head 2 --color always
[ "$rc" -eq 0 ] && [ "$(ls "$TMP/head")" = "show_l1_h2.png" ] && pass || fail "--layer 1 --head 2: exit $rc"
picture "$TMP/head/show_l1_h2.png" 384 384 700 700
grep -q $'\x1b\\[48;2;' "$TMP/stdout" && grep -q "layer 1, head 2" "$TMP/stdout" && grep -q "hello" "$TMP/stdout" &&
    pass || fail "terminal heatmap of layer 1, head 2"
# Without --out: the current folder.
mkdir "$TMP/cwd"
case $QKV in /*) q=$QKV ;; *) q=$PWD/$QKV ;; esac
(cd "$TMP/cwd" && "$q" show --model "$MODEL" --text "$TEXT" --layer 0 --head 0 --color never >/dev/null 2>&1)
[ -f "$TMP/cwd/show_l0_h0.png" ] && pass || fail "no show_l0_h0.png in the current folder"

# expect_fail STATUS WORDS ARGS...: show ARGS exits STATUS, its message says
# WORDS, and neither $TMP/x nor $TMP/x.npy appears.
expect_fail() {
    local want=$1 words=$2
    shift 2
    run show "$@"
    [ "$rc" -eq "$want" ] && grep -q "^qkv show: " "$TMP/stderr" && grep -qF -- "$words" "$TMP/stderr" && pass ||
        fail "show $*: exit $rc (want $want, a message with '$words')"
    [ ! -e "$TMP/x" ] && [ ! -e "$TMP/x.npy" ] && pass || fail "show $*: left $(ls -d "$TMP"/x*)"
}
expect_fail 1 "$TMP/nothing" --model "$TMP/nothing" --text "$TEXT" --out "$TMP/x" --npy "$TMP/x.npy"
expect_fail 1 "0..1" --model "$MODEL" --text "$TEXT" --layer 2 --out "$TMP/x" --npy "$TMP/x.npy"
expect_fail 1 "0..1" --model "$MODEL" --text "$TEXT" --layer -1 --out "$TMP/x"
expect_fail 1 "0..3" --model "$MODEL" --text "$TEXT" --layer 0 --head 4 --out "$TMP/x" --npy "$TMP/x.npy"
expect_fail 1 "UTF-8" --model "$MODEL" --text $'caf\xc3' --out "$TMP/x" --npy "$TMP/x.npy"
expect_fail 1 "UTF-8" --model "$MODEL" --text $'\xff love' --out "$TMP/x"
expect_fail 2 "needs --layer" --model "$MODEL" --text "$TEXT" --head 1 --out "$TMP/x"
expect_fail 2 "empty" --model "$MODEL" --text "" --out "$TMP/x"
expect_fail 2 "--layer" --model "$MODEL" --text "$TEXT" --layer one --out "$TMP/x"
expect_fail 2 "not both" --model "$MODEL" --ckpt "$MODEL" --text "$TEXT" --out "$TMP/x"
expect_fail 2 "--ckpt only" --model "$MODEL" --text "$TEXT" --tokens bytes --out "$TMP/x"
expect_fail 2 "--model only" --ckpt "$MODEL" --text "$TEXT" --npy "$TMP/x.npy"
expect_fail 2 "--model only" --ckpt "$MODEL" --text "$TEXT" --layer 0
# A picture or the --npy file that cannot be written: exit 1, and what was
# written before it removed.
mkdir -p "$TMP/blk/show_l1.png"
expect_fail 1 "show_l1.png" --model "$MODEL" --text "$TEXT" --out "$TMP/blk" --npy "$TMP/x.npy"
[ "$(ls -A "$TMP/blk")" = "show_l1.png" ] && pass || fail "left behind: $(ls -A "$TMP/blk" | tr '\n' ' ')"
# (the pictures go first, into a folder this run makes and removes again)
expect_fail 1 "$TMP/none/maps.npy" --model "$MODEL" --text "$TEXT" --out "$TMP/x" --npy "$TMP/none/maps.npy"
"$QKV" show --help | grep -q "^       qkv show --model DIR" && pass || fail "--help names --model"

cli_finish show_model
