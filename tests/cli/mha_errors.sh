#!/usr/bin/env bash
# Failing runs of `qkv mha`: every bad weights file, input or option must give
# a non-zero exit (2 for usage errors, 1 for the others), a message on stderr
# that names the option and file at fault, nothing on stdout, and no output
# file or temporary file left in the output folder.
# Usage: mha_errors.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init mha_errors "$@"
FX=$ROOT/tests/data/cli/mha
n=0

# expect WANT_RC NEEDLE ARGS...: run qkv ARGS with @O@ (in ARGS and NEEDLE)
# replaced by a fresh, empty output folder; the exit status must be WANT_RC,
# stderr must contain NEEDLE (a fixed string), stdout must be empty and the
# folder must stay empty.
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

# le64 N: N as 8 little-endian bytes.
le64() {
    local i v=$1
    for i in 0 1 2 3 4 5 6 7; do
        printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"
    done
}

# mkst FILE NAME=[DTYPE:]DIMxDIM... : a safetensors file of zero-filled
# tensors (4-byte dtypes), e.g. mkst w.safetensors in_proj_weight=24x8 x=I32:3.
mkst() {
    local file=$1 spec name rest dtype count d json="{" sep="" off=0
    shift
    for spec in "$@"; do
        name=${spec%%=*}
        rest=${spec#*=}
        dtype=F32
        if [[ $rest == *:* ]]; then
            dtype=${rest%%:*}
            rest=${rest#*:}
        fi
        count=1
        for d in ${rest//x/ }; do count=$((count * d)); done
        json+="$sep\"$name\":{\"dtype\":\"$dtype\",\"shape\":[${rest//x/,}],\"data_offsets\":[$off,$((off + 4 * count))]}"
        off=$((off + 4 * count))
        sep=","
    done
    json+="}"
    while [ $((${#json} % 8)) -ne 0 ]; do json+=" "; done
    {
        le64 ${#json}
        printf '%s' "$json"
        head -c "$off" /dev/zero
    } >"$file"
}

# mknpy FILE DESCR SHAPE DATA_BYTES: a .npy file version 1.0 of zero bytes.
mknpy() {
    local file=$1 header="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
    local hl=$(((10 + ${#header} + 1 + 63) / 64 * 64 - 10))
    while [ ${#header} -lt $((hl - 1)) ]; do header="$header "; done
    {
        printf '\x93NUMPY\x01\x00'
        printf "\\x$(printf %02x $((hl & 255)))\\x$(printf %02x $((hl >> 8)))"
        printf '%s\n' "$header"
        head -c "$4" /dev/zero
    } >"$file"
}

W=$FX/weights.safetensors
X=$FX/x.npy
SELF=(mha --weights "$W" --prefix self. --heads 2)
CROSS=(mha --weights "$W" --prefix cross. --heads 2)
OUT=(-o @O@/y.npy)
CX=(--x "$FX/cx.npy" --k "$FX/cxk.npy" --v "$FX/cxv.npy")

# ---- usage -----------------------------------------------------------------
expect 2 "Usage: qkv mha" mha
expect 2 "missing --weights W.safetensors" mha --heads 2 --x "$X" "${OUT[@]}"
expect 2 "missing --heads H" mha --weights "$W" --x "$X" "${OUT[@]}"
expect 2 "missing --x X.npy" mha --weights "$W" --heads 2 "${OUT[@]}"
expect 2 "missing -o Y.npy" "${SELF[@]}" --x "$X" --attn @O@/a.npy
expect 2 "--heads: '0' is out of range" mha --weights "$W" --heads 0 --x "$X" "${OUT[@]}"
expect 2 "--heads: 'two' is not an integer" mha --weights "$W" --heads two --x "$X" "${OUT[@]}"
expect 2 "--heads-kv: '0' is out of range" "${SELF[@]}" --heads-kv 0 --x "$X" "${OUT[@]}"
expect 2 "--heads-kv: 3 does not divide --heads 2" "${SELF[@]}" --heads-kv 3 --x "$X" "${OUT[@]}"
expect 2 "--kv: gives keys and values from one file" "${SELF[@]}" --x "$X" --kv "$X" --k "$X" \
    --v "$X" "${OUT[@]}"
expect 2 "--k: needs --v too" "${SELF[@]}" --x "$X" --k "$X" "${OUT[@]}"
expect 2 "--v: needs --k too" "${SELF[@]}" --x "$X" --v "$X" "${OUT[@]}"
expect 2 "--causal: and --mask both set the mask" "${SELF[@]}" --x "$X" --causal --mask causal "${OUT[@]}"
expect 2 "--mask: unknown mask 'diagonal'" "${SELF[@]}" --x "$X" --mask diagonal "${OUT[@]}"
expect 2 "--mask: 'window:3'" "${SELF[@]}" --x "$X" --mask window:3 "${OUT[@]}"
expect 2 "--mask: 'window' needs" "${SELF[@]}" --x "$X" --mask window "${OUT[@]}"
expect 2 "--mask window:-1,2: left extent" "${SELF[@]}" --x "$X" --mask window:-1,2 "${OUT[@]}"
expect 2 "--mask window:1,x: right extent" "${SELF[@]}" --x "$X" --mask window:1,x "${OUT[@]}"
expect 2 "--mask: 'causal-window:1,1'" "${SELF[@]}" --x "$X" --mask causal-window:1,1 "${OUT[@]}"
expect 2 "--pos: unknown positional encoding 'learned'" "${SELF[@]}" --x "$X" --pos learned "${OUT[@]}"
expect 2 "--join: unknown head join 'sum'" "${SELF[@]}" --x "$X" --join sum "${OUT[@]}"
expect 2 "--rope-base: needs --pos rope" "${SELF[@]}" --x "$X" --rope-base 100 "${OUT[@]}"
expect 2 "--rope-base: '1' must be > 1" "${SELF[@]}" --x "$X" --pos rope --rope-base 1 "${OUT[@]}"
expect 2 "--rope-base: 'inf' is not a finite number" "${SELF[@]}" --x "$X" --pos rope --rope-base inf \
    "${OUT[@]}"
expect 2 "--impl: unknown implementation 'quick'" "${SELF[@]}" --x "$X" --impl quick "${OUT[@]}"
expect 2 "--threads: '-1' is out of range" "${SELF[@]}" --x "$X" --threads -1 "${OUT[@]}"
expect 2 "-o and --attn name the same file" "${SELF[@]}" --x "$X" -o @O@/y.npy --attn @O@/y.npy
expect 2 "--x: given twice" "${SELF[@]}" --x "$X" --x "$X" "${OUT[@]}"
expect 2 "unknown option '--q'" "${SELF[@]}" --q "$X" "${OUT[@]}"
expect 2 "--causal: takes no value" "${SELF[@]}" --x "$X" --causal=yes "${OUT[@]}"
expect 2 "unexpected argument 'extra'" "${SELF[@]}" --x "$X" "${OUT[@]}" extra

# ---- the weights file ------------------------------------------------------
mkdir -p "$TMP/adir"
head -c 100 "$W" >"$TMP/trunc.safetensors"
printf 'not a safetensors file\n' >"$TMP/text.safetensors"
: >"$TMP/zero.safetensors"
{ le64 999999; printf '{}'; } >"$TMP/lies.safetensors"
mkst "$TMP/f17.safetensors" in_proj_weight=F17:24x8
expect 1 "--weights $TMP/nope.safetensors:" mha --weights "$TMP/nope.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
expect 1 "--weights $TMP/adir:" mha --weights "$TMP/adir" --heads 2 --x "$X" "${OUT[@]}"
expect 1 "--weights $TMP/trunc.safetensors:" mha --weights "$TMP/trunc.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
expect 1 "--weights $TMP/text.safetensors:" mha --weights "$TMP/text.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
expect 1 "--weights $TMP/zero.safetensors:" mha --weights "$TMP/zero.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
expect 1 "--weights $TMP/lies.safetensors:" mha --weights "$TMP/lies.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
expect 1 "--weights $TMP/f17.safetensors:" mha --weights "$TMP/f17.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"
# The file's text appears after the name (no partial or empty message).
expect 1 "--weights $TMP/text.safetensors: " mha --weights "$TMP/text.safetensors" --heads 2 --x "$X" \
    "${OUT[@]}"

# Missing and misshapen tensors.
expect 1 "--weights $W: tensor 'in_proj_weight' (or 'q_proj_weight') is missing; prefixes that have one: 'cross.', 'self.'" \
    mha --weights "$W" --heads 2 --x "$X" "${OUT[@]}"
expect 1 "tensor 'layer.in_proj_weight' (or 'layer.q_proj_weight') is missing" \
    mha --weights "$W" --prefix layer. --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/no_out.safetensors" in_proj_weight=24x8 in_proj_bias=24 out_proj.bias=8
expect 1 "--weights $TMP/no_out.safetensors: tensor 'out_proj.weight' is missing" \
    mha --weights "$TMP/no_out.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/no_outb.safetensors" in_proj_weight=24x8 in_proj_bias=24 out_proj.weight=8x8
expect 1 "--weights $TMP/no_outb.safetensors: tensor 'out_proj.bias' is missing" \
    mha --weights "$TMP/no_outb.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bad_out.safetensors" in_proj_weight=24x8 out_proj.weight=8x3
expect 1 "--weights $TMP/bad_out.safetensors: tensor 'out_proj.weight' should have shape [8, 8]" \
    mha --weights "$TMP/bad_out.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bad_bias.safetensors" in_proj_weight=24x8 in_proj_bias=20 out_proj.weight=8x8 out_proj.bias=8
expect 1 "--weights $TMP/bad_bias.safetensors: tensor 'in_proj_bias' should have shape [24]" \
    mha --weights "$TMP/bad_bias.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bad_in.safetensors" in_proj_weight=20x8 out_proj.weight=8x8
expect 1 "--weights $TMP/bad_in.safetensors: tensor 'in_proj_weight' [20, 8] should be [3E, E]" \
    mha --weights "$TMP/bad_in.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/vec_in.safetensors" in_proj_weight=24 out_proj.weight=8x8
expect 1 "--weights $TMP/vec_in.safetensors: tensor 'in_proj_weight' [24] should be [3E, E]" \
    mha --weights "$TMP/vec_in.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/int_in.safetensors" in_proj_weight=I32:24x8 out_proj.weight=8x8
expect 1 "--weights $TMP/int_in.safetensors: tensor 'in_proj_weight' is not floating point" \
    mha --weights "$TMP/int_in.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/outb_only.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 out_proj.bias=8
expect 1 "--weights $TMP/outb_only.safetensors: has 'out_proj.bias' but no 'in_proj_bias'" \
    mha --weights "$TMP/outb_only.safetensors" --heads 2 --x "$X" "${OUT[@]}"
# bias_k/bias_v (torch's add_bias_kv=True): both or neither, torch's shape,
# and no window mask (the extra key is seen by every query).
mkst "$TMP/bias_k_only.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 bias_k=1x1x8
expect 1 "--weights $TMP/bias_k_only.safetensors: has 'bias_k' but no 'bias_v'" \
    mha --weights "$TMP/bias_k_only.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bias_v_only.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 bias_v=1x1x8
expect 1 "--weights $TMP/bias_v_only.safetensors: has 'bias_v' but no 'bias_k'" \
    mha --weights "$TMP/bias_v_only.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bias_kv_bad.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 bias_k=1x1x8 bias_v=8
expect 1 "--weights $TMP/bias_kv_bad.safetensors: tensor 'bias_v' should have shape [1, 1, 8]" \
    mha --weights "$TMP/bias_kv_bad.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/bias_kv.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 bias_k=1x1x8 bias_v=1x1x8
expect 1 "--mask: a window cannot be used with the layer's 'bias_k'/'bias_v'" \
    mha --weights "$TMP/bias_kv.safetensors" --heads 2 --x "$X" --mask window:1,1 "${OUT[@]}"
expect 1 "--mask: a window cannot be used with the layer's 'bias_k'/'bias_v'" \
    mha --weights "$TMP/bias_kv.safetensors" --heads 2 --x "$X" --mask causal-window:2 "${OUT[@]}"
# The additive score: additive.w1 [H, A, Dh], additive.w2 alike, additive.w [H, A].
mkst "$TMP/add_bad.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 additive.w1=2x3x5 \
    additive.w2=2x3x4 additive.w=2x3
expect 1 "--weights $TMP/add_bad.safetensors: tensor 'additive.w1' [2, 3, 5] should be [H, A, Dh] = [2, A, 4]" \
    mha --weights "$TMP/add_bad.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/add_now.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 additive.w1=2x3x4 additive.w2=2x3x4
expect 1 "--weights $TMP/add_now.safetensors: tensor 'additive.w' is missing" \
    mha --weights "$TMP/add_now.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/add_w2.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 additive.w1=2x3x4 additive.w2=2x4x4 \
    additive.w=2x3
expect 1 "--weights $TMP/add_w2.safetensors: tensor 'additive.w2' should have shape [2, 3, 4]" \
    mha --weights "$TMP/add_w2.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/add.safetensors" in_proj_weight=24x8 out_proj.weight=8x8 additive.w1=2x3x4 additive.w2=2x3x4 \
    additive.w=2x3
expect 1 "--impl: fast does not compute the additive score of 'additive.w1'" \
    mha --weights "$TMP/add.safetensors" --heads 2 --x "$X" --impl fast "${OUT[@]}"
mkst "$TMP/both.safetensors" in_proj_weight=24x8 q_proj_weight=8x8 out_proj.weight=8x8
expect 1 "--weights $TMP/both.safetensors: has both 'in_proj_weight' and 'q_proj_weight'" \
    mha --weights "$TMP/both.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/q_only.safetensors" q_proj_weight=8x8 v_proj_weight=8x8 out_proj.weight=8x8
expect 1 "--weights $TMP/q_only.safetensors: tensor 'k_proj_weight' is missing" \
    mha --weights "$TMP/q_only.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/qk_only.safetensors" q_proj_weight=8x8 k_proj_weight=8x8 out_proj.weight=8x8
expect 1 "--weights $TMP/qk_only.safetensors: tensor 'v_proj_weight' is missing" \
    mha --weights "$TMP/qk_only.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/k_rows.safetensors" q_proj_weight=8x8 k_proj_weight=3x8 v_proj_weight=3x8 out_proj.weight=8x8
expect 1 "--weights $TMP/k_rows.safetensors: tensor 'k_proj_weight' [3, 8] should have H_kv Dh rows" \
    mha --weights "$TMP/k_rows.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/v_rows.safetensors" q_proj_weight=8x8 k_proj_weight=8x6 v_proj_weight=4x5 out_proj.weight=8x8
expect 1 "--weights $TMP/v_rows.safetensors: tensor 'v_proj_weight' [4, 5] should have 8 rows" \
    mha --weights "$TMP/v_rows.safetensors" --heads 2 --x "$X" "${OUT[@]}"

# Weights that do not fit the options.
expect 1 "--weights $W: --heads 3 does not divide E = 8 (from 'self.in_proj_weight' [24, 8])" \
    mha --weights "$W" --prefix self. --heads 3 --x "$X" "${OUT[@]}"
expect 1 "--weights $W: --heads 3 does not divide the 8 rows of 'cross.q_proj_weight'" \
    mha --weights "$W" --prefix cross. --heads 3 "${CX[@]}" "${OUT[@]}"
expect 1 "--weights $W: --heads-kv 1: tensor 'self.in_proj_weight' is a fused projection" \
    "${SELF[@]}" --heads-kv 1 --x "$X" "${OUT[@]}"
expect 1 "--weights $FX/gqa.safetensors: --heads-kv 4 does not fit tensor 'k_proj_weight' [4, 8]" \
    mha --weights "$FX/gqa.safetensors" --heads 4 --heads-kv 4 --x "$X" "${OUT[@]}"
expect 1 "--weights $W: tensor 'self.out_proj.weight' [8, 8] is [E, H Dh], the shape for --join concat" \
    "${SELF[@]}" --x "$X" --join mean "${OUT[@]}"
expect 1 "--weights $FX/mean.safetensors: tensor 'out_proj.weight' [8, 4] is [E, Dh], the shape for --join mean" \
    mha --weights "$FX/mean.safetensors" --heads 2 --x "$X" "${OUT[@]}"
mkst "$TMP/odd.safetensors" in_proj_weight=18x6 out_proj.weight=6x6
expect 1 "--weights $TMP/odd.safetensors: --pos rope needs an even head dim, but Dh = 3" \
    mha --weights "$TMP/odd.safetensors" --heads 2 --x "$X" --pos rope "${OUT[@]}"

# ---- inputs ----------------------------------------------------------------
mknpy "$TMP/x_e7.npy" '<f4' '(2, 5, 7)' 280
mknpy "$TMP/x_r1.npy" '<f4' '(8,)' 32
mknpy "$TMP/x_r4.npy" '<f4' '(1, 2, 5, 8)' 320
mknpy "$TMP/x_empty.npy" '<f4' '(2, 0, 8)' 0
mknpy "$TMP/x_short.npy" '<f4' '(2, 2, 8)' 128
mknpy "$TMP/x_b3.npy" '<f4' '(3, 5, 8)' 480
mknpy "$TMP/v_n4.npy" '<f4' '(2, 4, 5)' 160
mknpy "$TMP/kv_b3.npy" '<f4' '(3, 6, 6)' 432
mknpy "$TMP/lens_f.npy" '<f4' '(2,)' 8
mknpy "$TMP/lens3.npy" '<i8' '(3,)' 24
head -c 100 "$X" >"$TMP/trunc.npy"
expect 1 "--x $TMP/nope.npy:" "${SELF[@]}" --x "$TMP/nope.npy" "${OUT[@]}"
expect 1 "--x $TMP/trunc.npy:" "${SELF[@]}" --x "$TMP/trunc.npy" "${OUT[@]}"
expect 1 "--x $TMP/x_e7.npy: shape [2, 5, 7] does not fit the weights: last dim 7 != E = 8 (from --weights $W)" \
    "${SELF[@]}" --x "$TMP/x_e7.npy" "${OUT[@]}"
expect 1 "--x $TMP/x_r1.npy: rank 1 array [8]: expected [n, E] or [B, n, E]" \
    "${SELF[@]}" --x "$TMP/x_r1.npy" "${OUT[@]}"
expect 1 "--x $TMP/x_r4.npy: rank 4 array" "${SELF[@]}" --x "$TMP/x_r4.npy" "${OUT[@]}"
expect 1 "--x $TMP/x_empty.npy: shape [2, 0, 8] has an empty dimension" \
    "${SELF[@]}" --x "$TMP/x_empty.npy" "${OUT[@]}"
expect 1 "--x $FX/lens.npy: dtype int64 is not accepted" "${SELF[@]}" --x "$FX/lens.npy" "${OUT[@]}"
expect 1 "--weights $W: the layer's key and value inputs have dims kdim 6, vdim 5 != E = 8" \
    "${CROSS[@]}" --x "$FX/cx.npy" "${OUT[@]}"
expect 1 "--kv $FX/cxk.npy: gives keys = values, but the weights' keys and values have different input dims (kdim 6, vdim 5)" \
    "${CROSS[@]}" --x "$FX/cx.npy" --kv "$FX/cxk.npy" "${OUT[@]}"
expect 1 "--k $FX/cxv.npy: shape [2, 6, 5] does not fit the weights: last dim 5 != kdim = 6" \
    "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxv.npy" --v "$FX/cxv.npy" "${OUT[@]}"
expect 1 "--v $FX/cxk.npy: shape [2, 6, 6] does not fit the weights: last dim 6 != vdim = 5" \
    "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk.npy" --v "$FX/cxk.npy" "${OUT[@]}"
expect 1 "--v $TMP/v_n4.npy: shape [2, 4, 5] does not fit --k $FX/cxk.npy [2, 6, 6]: number of keys n_k 4 != 6" \
    "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk.npy" --v "$TMP/v_n4.npy" "${OUT[@]}"
expect 1 "--k $FX/cxk1.npy: shape [6, 6] has rank 2, but --x $FX/cx.npy [2, 5, 8] has rank 3" \
    "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk1.npy" --v "$FX/cxv.npy" "${OUT[@]}"
expect 1 "--kv $TMP/kv_b3.npy: shape [3, 6, 6] does not fit --x $X [2, 5, 8]: batch 3 != 2" \
    mha --weights "$FX/kv.safetensors" --heads 2 --x "$X" --kv "$TMP/kv_b3.npy" "${OUT[@]}"
expect 1 "--kv $TMP/nope.npy:" mha --weights "$FX/kv.safetensors" --heads 2 --x "$X" \
    --kv "$TMP/nope.npy" "${OUT[@]}"
expect 1 "--kv $X: shape [2, 5, 8] does not fit the weights: last dim 8 != kdim = 6" \
    mha --weights "$FX/kv.safetensors" --heads 2 --x "$X" --kv "$X" "${OUT[@]}"
expect 1 "--key-lengths $TMP/lens_f.npy: dtype float32 is not accepted: expected int32 or int64" \
    "${SELF[@]}" --x "$X" --key-lengths "$TMP/lens_f.npy" "${OUT[@]}"
expect 1 "--key-lengths $TMP/lens3.npy: shape [3] does not fit: expected [B] = [2] (B from --x $X)" \
    "${SELF[@]}" --x "$X" --key-lengths "$TMP/lens3.npy" "${OUT[@]}"
expect 1 "--key-lengths $FX/lens.npy: shape [2] does not fit: expected [B] = [1]" \
    "${SELF[@]}" --x "$FX/x1.npy" --key-lengths "$FX/lens.npy" "${OUT[@]}"
expect 1 "--key-lengths $FX/lens.npy: entry 0 is 5, outside 0..2 (the number of keys n_k)" \
    "${SELF[@]}" --x "$TMP/x_short.npy" --key-lengths "$FX/lens.npy" "${OUT[@]}"
expect 1 "--key-lengths $TMP/nope.npy:" "${SELF[@]}" --x "$X" --key-lengths "$TMP/nope.npy" "${OUT[@]}"

# ---- a write that fails removes what this run wrote before it --------------
expect 1 "--attn @O@/no/such/dir/attn.npy: cannot write" "${SELF[@]}" --x "$X" -o @O@/y.npy \
    --attn @O@/no/such/dir/attn.npy
expect 1 "-o @O@/no/such/dir/y.npy: cannot write" "${SELF[@]}" --x "$X" -o @O@/no/such/dir/y.npy \
    --attn @O@/a.npy

# A failed run leaves an existing output file as it was.
n=$((n + 1))
cp "$X" "$TMP/keep.npy"
"$QKV" "${SELF[@]}" --x "$TMP/x_e7.npy" -o "$TMP/keep.npy" >/dev/null 2>"$TMP/stderr"
if [ $? -eq 1 ] && cmp -s "$X" "$TMP/keep.npy"; then
    passed=$((passed + 1))
else
    fail "case $n: a failed run changed an existing output file"
fi

cli_finish
