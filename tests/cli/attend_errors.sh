#!/usr/bin/env bash
# Failing runs of `qkv attend`: every bad input or option must give a non-zero
# exit (2 for usage errors, 1 for the others), a message on stderr that names
# the option and file at fault, nothing on stdout, and no output file or
# temporary file left in the output folder.
# Usage: attend_errors.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init attend_errors "$@"
EX=$ROOT/examples/data
FX=$ROOT/tests/data/cli
n=0

# expect WANT_RC NEEDLE ARGS...: run qkv ARGS with @O@ (in ARGS and NEEDLE)
# replaced by a fresh, empty output folder; the exit status must be WANT_RC, stderr must contain
# NEEDLE (a fixed string), stdout must be empty and the folder must stay empty.
expect() {
    local want=$1 needle=$2 a
    shift 2
    n=$((n + 1))
    local out="$TMP/out$n" args=()
    mkdir -p "$out"
    needle=${needle//@O@/$out}
    for a in "$@"; do args+=("${a//@O@/$out}"); done
    "$QKV" ${args[@]+"${args[@]}"} >"$TMP/stdout" 2>"$TMP/stderr"
    local rc=$?
    local name="case $n (qkv ${args[*]})"
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/stderr"; then
        fail "$name: stderr does not contain '$needle'"
    elif [ -s "$TMP/stdout" ]; then
        fail "$name: unexpected stdout: $(head -c 200 "$TMP/stdout")"
    elif [ -n "$(ls -A "$out")" ]; then
        fail "$name: left behind: $(ls -A "$out" | tr '\n' ' ')"
    else
        passed=$((passed + 1))
    fi
}

# mknpy FILE DESCR FORTRAN SHAPE DATA_BYTES: a .npy file version 1.0 with the
# given header fields and DATA_BYTES zero bytes of data.
mknpy() {
    local file=$1 header="{'descr': '$2', 'fortran_order': $3, 'shape': $4, }"
    local hl=$(((10 + ${#header} + 1 + 63) / 64 * 64 - 10))
    while [ ${#header} -lt $((hl - 1)) ]; do header="$header "; done
    {
        printf '\x93NUMPY\x01\x00'
        printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"
        printf '%s\n' "$header"
        head -c "$5" /dev/zero
    } >"$file"
}

Q=$EX/hello_q.npy
K=$EX/hello_k.npy
V=$EX/hello_v.npy
HQ=(--q "$Q" --k "$K" --v "$V")
OUT=(-o @O@/out.npy)

# ---- bad files ---------------------------------------------------------------
mkdir -p "$TMP/adir"
head -c 150 "$Q" >"$TMP/trunc.npy"
mknpy "$TMP/be.npy" '>f4' False '(4, 4)' 64
mknpy "$TMP/fortran.npy" '<f4' True '(4, 4)' 64
mknpy "$TMP/u2.npy" '<u2' False '(4, 4)' 32
mknpy "$TMP/empty.npy" '<f4' False '(0, 4)' 0
mknpy "$TMP/good.npy" '<f4' False '(4, 4)' 64
printf 'not a numpy file\n' >"$TMP/text.npy"
: >"$TMP/zero.npy"

expect 1 "--q $TMP/nope.npy" attend --q "$TMP/nope.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--k $TMP/adir" attend --q "$Q" --k "$TMP/adir" --v "$V" "${OUT[@]}"
expect 1 "--q $TMP/trunc.npy" attend --q "$TMP/trunc.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--v $TMP/be.npy" attend --q "$Q" --k "$K" --v "$TMP/be.npy" "${OUT[@]}"
expect 1 "--q $TMP/fortran.npy" attend --q "$TMP/fortran.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--k $TMP/u2.npy: dtype uint16 ('<u2') holds bf16 bit patterns" \
    attend --q "$Q" --k "$TMP/u2.npy" --v "$V" "${OUT[@]}"
expect 1 "--q $TMP/text.npy" attend --q "$TMP/text.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--q $TMP/zero.npy" attend --q "$TMP/zero.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--q $TMP/empty.npy" attend --q "$TMP/empty.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--grad-out $TMP/nope.npy" attend "${HQ[@]}" --grad-out "$TMP/nope.npy" \
    --dq @O@/dq.npy --dk @O@/dk.npy --dv @O@/dv.npy
expect 1 "--bias $TMP/be.npy" attend "${HQ[@]}" "${OUT[@]}" --bias "$TMP/be.npy"

# ---- dtypes and shapes -----------------------------------------------------
expect 1 "--q $FX/q_int.npy: dtype int32" attend --q "$FX/q_int.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--q $FX/vec.npy: rank 1" attend --q "$FX/vec.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--k $K: shape [4, 4] does not fit --q $FX/q3.npy [4, 2, 4]: rank 2 != 3" \
    attend --q "$FX/q3.npy" --k "$K" --v "$V" "${OUT[@]}"
expect 1 "--k $FX/k_d3.npy: shape [4, 3] does not fit --q $Q [4, 4]: head dim 3 != 4" \
    attend --q "$Q" --k "$FX/k_d3.npy" --v "$V" "${OUT[@]}"
expect 1 "--v $FX/v_n5.npy: shape [5, 4] does not fit --k $K [4, 4]: number of keys n 5 != 4" \
    attend --q "$Q" --k "$K" --v "$FX/v_n5.npy" "${OUT[@]}"
expect 1 "--k $FX/k3.npy: shape [5, 2, 4] does not fit --q $FX/q3h3.npy [4, 3, 4]: 3 query heads" \
    attend --q "$FX/q3h3.npy" --k "$FX/k3.npy" --v "$FX/v3.npy" "${OUT[@]}"
expect 1 "--k $FX/k4.npy: shape [2, 3, 1, 4] does not fit --q $FX/q3.npy" \
    attend --q "$FX/q3.npy" --k "$FX/k4.npy" --v "$FX/v4.npy" "${OUT[@]}"
expect 1 "--grad-out $FX/dout3.npy: shape [4, 2, 3] does not fit" attend "${HQ[@]}" \
    --grad-out "$FX/dout3.npy" --dq @O@/dq.npy --dk @O@/dk.npy --dv @O@/dv.npy
expect 1 "--bias $FX/bias_bad.npy: shape [3, 4] does not fit" \
    attend "${HQ[@]}" "${OUT[@]}" --bias "$FX/bias_bad.npy"
expect 1 "--bias $FX/q_int.npy: dtype int32" attend "${HQ[@]}" "${OUT[@]}" --bias "$FX/q_int.npy"
expect 1 "--key-lengths $FX/lens_bad.npy: entry 0 is 9, outside 0..4" \
    attend "${HQ[@]}" "${OUT[@]}" --key-lengths "$FX/lens_bad.npy"
expect 1 "--key-lengths $FX/lens_float.npy: dtype float32" \
    attend "${HQ[@]}" "${OUT[@]}" --key-lengths "$FX/lens_float.npy"
expect 1 "--key-lengths $FX/lens4.npy: shape [2] does not fit" \
    attend "${HQ[@]}" "${OUT[@]}" --key-lengths "$FX/lens4.npy"
expect 1 "--seq-offsets $FX/offsets_bad.npy: entry 2 (2) is smaller than entry 1 (3)" \
    attend "${HQ[@]}" "${OUT[@]}" --seq-offsets "$FX/offsets_bad.npy"
expect 1 "--seq-offsets $FX/offsets_end.npy: last entry is 5" \
    attend "${HQ[@]}" "${OUT[@]}" --seq-offsets "$FX/offsets_end.npy"
expect 1 "--seq-offsets $FX/offsets.npy: packed sequences need B = 1" \
    attend --q "$FX/q4.npy" --k "$FX/k4.npy" --v "$FX/v4.npy" "${OUT[@]}" --seq-offsets "$FX/offsets.npy"
expect 1 "--seq-offsets $FX/offsets.npy: packed sequences need n_q = n_k" \
    attend --q "$FX/q3.npy" --k "$FX/k3.npy" --v "$FX/v3.npy" "${OUT[@]}" --seq-offsets "$FX/offsets.npy"
expect 1 "--seq-offsets $FX/q_int.npy: shape [4, 4] does not fit" \
    attend "${HQ[@]}" "${OUT[@]}" --seq-offsets "$FX/q_int.npy"

# ---- options ---------------------------------------------------------------
expect 2 "--mask: 'window:3'" attend "${HQ[@]}" "${OUT[@]}" --mask window:3
expect 2 "--mask: 'window' needs" attend "${HQ[@]}" "${OUT[@]}" --mask window
expect 2 "--mask window:-1,2: left extent" attend "${HQ[@]}" "${OUT[@]}" --mask window:-1,2
expect 2 "--mask window:1,-2: right extent" attend "${HQ[@]}" "${OUT[@]}" --mask window:1,-2
expect 2 "--mask window:1,2,3: right extent" attend "${HQ[@]}" "${OUT[@]}" --mask window:1,2,3
expect 2 "--mask window:,1: left extent" attend "${HQ[@]}" "${OUT[@]}" --mask window:,1
expect 2 "--mask causal-window:x: left extent" attend "${HQ[@]}" "${OUT[@]}" --mask causal-window:x
expect 2 "--mask: 'causal-window:1,1'" attend "${HQ[@]}" "${OUT[@]}" --mask causal-window:1,1
expect 2 "--mask: unknown mask 'diagonal'" attend "${HQ[@]}" "${OUT[@]}" --mask diagonal
expect 2 "--score: unknown score 'cos'" attend "${HQ[@]}" "${OUT[@]}" --score cos
expect 2 "--score: 'additive'" attend "${HQ[@]}" "${OUT[@]}" --score additive
expect 2 "--norm: unknown normaliser 'tanh'" attend "${HQ[@]}" "${OUT[@]}" --norm tanh
expect 2 "--dtype: unknown type 'bf8' (expected float32, float64, bf16 or fp16)" \
    attend "${HQ[@]}" "${OUT[@]}" --dtype bf8
expect 2 "--impl: unknown implementation 'quick'" attend "${HQ[@]}" "${OUT[@]}" --impl quick
expect 1 "not supported" attend "${HQ[@]}" "${OUT[@]}" --impl fast --dtype float64
expect 2 "--scale: 'abc' is not a number" attend "${HQ[@]}" "${OUT[@]}" --scale abc
expect 2 "--scale: '0.5x' is not a number" attend "${HQ[@]}" "${OUT[@]}" --scale 0.5x
expect 2 "--scale: '1e999' is not a finite number" attend "${HQ[@]}" "${OUT[@]}" --scale 1e999
expect 2 "--scale: 'nan' is not a finite number" attend "${HQ[@]}" "${OUT[@]}" --scale nan
expect 2 "--scale: '0' must be non-zero" attend "${HQ[@]}" "${OUT[@]}" --scale 0
expect 2 "--scale: applies only to --score scaled" attend "${HQ[@]}" "${OUT[@]}" --score dot --scale 2
expect 2 "--temperature: '0' must be > 0" attend "${HQ[@]}" "${OUT[@]}" --score cosine --temperature 0
expect 2 "--temperature: applies only to --score cosine" attend "${HQ[@]}" "${OUT[@]}" --temperature 2
expect 2 "--softcap: '-1' must be > 0" attend "${HQ[@]}" "${OUT[@]}" --softcap -1
expect 2 "--softcap: 'inf' is not a finite number" attend "${HQ[@]}" "${OUT[@]}" --softcap inf
expect 2 "--threads: '-1' is out of range" attend "${HQ[@]}" "${OUT[@]}" --threads -1
expect 2 "--threads: '1.5' is not an integer" attend "${HQ[@]}" "${OUT[@]}" --threads 1.5
expect 2 "--threads: ' 2' is not an integer" attend "${HQ[@]}" "${OUT[@]}" --threads " 2"
expect 2 "--threads: '99999999999999999999' is out of range" attend "${HQ[@]}" "${OUT[@]}" \
    --threads 99999999999999999999
expect 2 "--relu-count: needs --norm relu" attend "${HQ[@]}" "${OUT[@]}" --relu-count
expect 2 "--print: takes no value" attend "${HQ[@]}" "${OUT[@]}" --print=yes
expect 2 "unknown option '--query'" attend --query "$Q" --k "$K" --v "$V" "${OUT[@]}"
expect 2 "unexpected argument 'extra'" attend "${HQ[@]}" "${OUT[@]}" extra
expect 2 "--q: missing value" attend --k "$K" --v "$V" "${OUT[@]}" --q
expect 2 "--q: missing value (next is the option '--k')" attend --q --k "$K" --v "$V" "${OUT[@]}"
expect 2 "--mask: empty value" attend "${HQ[@]}" "${OUT[@]}" --mask=
expect 2 "missing --v FILE" attend --q "$Q" --k "$K" "${OUT[@]}"
expect 2 "missing -o OUT.npy" attend "${HQ[@]}"
expect 2 "--q: given twice" attend "${HQ[@]}" --q "$Q" "${OUT[@]}"
expect 2 "-o and --attn name the same file" attend "${HQ[@]}" -o @O@/x.npy --attn @O@/x.npy
expect 2 "--dq: needs --grad-out" attend "${HQ[@]}" "${OUT[@]}" --dq @O@/dq.npy
expect 2 "--dbias: needs --grad-out" attend "${HQ[@]}" "${OUT[@]}" --dbias @O@/db.npy
expect 2 "--grad-out: needs --dq, --dk and --dv (missing --dq FILE)" attend "${HQ[@]}" \
    --grad-out "$FX/dout2.npy" --dk @O@/dk.npy --dv @O@/dv.npy
expect 2 "--grad-out: needs --dq, --dk and --dv (missing --dv FILE)" attend "${HQ[@]}" \
    --grad-out "$FX/dout2.npy" --dq @O@/dq.npy --dk @O@/dk.npy
expect 2 "--dbias: needs --bias FILE" attend "${HQ[@]}" --grad-out "$FX/dout2.npy" \
    --dq @O@/dq.npy --dk @O@/dk.npy --dv @O@/dv.npy --dbias @O@/db.npy

# ---- the program -----------------------------------------------------------
expect 2 "Usage: qkv" # no arguments at all
expect 2 "Usage: qkv attend" attend
expect 2 "unknown command 'frobnicate'" frobnicate
expect 2 "unknown option '--frobnicate'" --frobnicate

# ---- a write that fails removes what this run wrote before it --------------
expect 1 "--attn @O@/no/such/dir/attn.npy" attend "${HQ[@]}" -o @O@/out.npy \
    --attn @O@/no/such/dir/attn.npy
expect 1 "--dv @O@/no/such/dir/dv.npy" attend "${HQ[@]}" -o @O@/out.npy --grad-out "$FX/dout2.npy" \
    --dq @O@/dq.npy --dk @O@/dk.npy --dv @O@/no/such/dir/dv.npy
expect 1 "-o @O@/no/such/dir/out.npy" attend "${HQ[@]}" -o @O@/no/such/dir/out.npy

# A failed run leaves an existing output file as it was.
n=$((n + 1))
cp "$TMP/good.npy" "$TMP/keep.npy"
"$QKV" attend --q "$TMP/nope.npy" --k "$K" --v "$V" -o "$TMP/keep.npy" >/dev/null 2>"$TMP/stderr"
if [ $? -eq 1 ] && cmp -s "$TMP/good.npy" "$TMP/keep.npy"; then
    passed=$((passed + 1))
else
    fail "case $n: a failed run changed an existing output file"
fi

cli_finish
