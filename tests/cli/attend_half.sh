#!/usr/bin/env bash
# `qkv attend --dtype bf16|fp16`: half-precision storage from the command line.
# Fixtures and the error bounds come from tests/data/cli/half/make_half.py:
# q [40, 4, 32], k, v [56, 2, 32] (grouped-query), causal; ref.npy is the exact
# output in float64 and tol.txt holds, per dtype, 2 x the error of a plain half
# implementation + 1e-5 (the library's accuracy rule, docs/HALF.md). Checked:
# the output's dtype ('<u2' bf16 bit patterns, '<f2' fp16, '<f4' with
# --out-float32), its error against ref.npy within that bound, float32 inputs
# converted on the fly giving the same bytes as inputs stored in half,
# --out-float32 being the exact widening of the half result, the backward's
# dtypes, and bad inputs (a '<u2' file without --dtype bf16, unknown dtype
# names, --out-float32 without a half dtype) failing with the file named and
# nothing written.
# Usage: attend_half.sh QKV_BINARY REPO_ROOT   (needs bash, coreutils, awk)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init attend_half "$@"
FX=$ROOT/tests/data/cli/half
ok() {
    local name=$1
    shift
    run "$@"
    if [ "$rc" -ne 0 ]; then fail "$name: exit $rc, want 0"; else pass; fi
}
# bad WANT_RC NEEDLE ARGS...: fails with WANT_RC, NEEDLE on stderr, nothing in $TMP/out
bad() {
    local want=$1 needle=$2
    shift 2
    rm -rf "$TMP/out" && mkdir -p "$TMP/out"
    run "$@"
    if [ "$rc" -ne "$want" ]; then
        fail "qkv $*: exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/stderr"; then
        fail "qkv $*: stderr does not contain '$needle'"
    elif [ -n "$(ls -A "$TMP/out")" ]; then
        fail "qkv $*: left behind $(ls -A "$TMP/out")"
    else
        pass
    fi
}
# values FILE TYPE COUNT: the last COUNT elements of FILE (od type f4, f8, u2, u4), one a line
values() {
    local size elem
    size=$(wc -c <"$1")
    case $2 in f8) elem=8 ;; f4 | u4) elem=4 ;; *) elem=2 ;; esac
    od -A n -v -t "$2" -j $((size - $3 * elem)) "$1" | tr -s ' ' '\n' | sed '/^$/d'
}
N=$((40 * 4 * 32))
values "$FX/ref.npy" f8 $N >"$TMP/ref.txt"
# within NAME FILE TOL: max |FILE (float32) - ref| <= TOL
within() {
    values "$2" f4 $N >"$TMP/got.txt"
    local r
    r=$(paste "$TMP/got.txt" "$TMP/ref.txt" | awk -v tol="$3" '
        { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "%d %.3g %s\n", n, m, (n == '"$N"' && m <= tol) ? "ok" : "bad" }')
    case $r in
    *" ok") pass; echo "$1: max error $(echo "$r" | cut -d' ' -f2) (bound $3)" ;;
    *) fail "$1: $r (count, max error) against the bound $3" ;;
    esac
}
TOL_BF16=$(awk '$1 == "bf16" { print $2 }' "$FX/tol.txt")
TOL_FP16=$(awk '$1 == "fp16" { print $2 }' "$FX/tol.txt")
IN=(--q "$FX/q.npy" --k "$FX/k.npy" --v "$FX/v.npy" --mask causal)
IN_U2=(--q "$FX/q_u2.npy" --k "$FX/k_u2.npy" --v "$FX/v_u2.npy" --mask causal)
IN_F2=(--q "$FX/q_f2.npy" --k "$FX/k_f2.npy" --v "$FX/v_f2.npy" --mask causal)
O=$TMP

# ---- float32 for scale ------------------------------------------------------
ok "float32" attend "${IN[@]}" -o "$O/f32.npy"
within "float32" "$O/f32.npy" 1e-5

# ---- bf16 ---------------------------------------------------------------------
ok "bf16 from float32 inputs" attend "${IN[@]}" --dtype bf16 -o "$O/bf.npy" --lse "$O/bf_lse.npy"
npy "$O/bf.npy" '<u2' '(40,4,32)'
npy "$O/bf_lse.npy" '<f4' '(4,40)'
ok "bf16 from '<u2' inputs" attend "${IN_U2[@]}" --dtype bfloat16 -o "$O/bf_u2.npy"
if cmp -s "$O/bf.npy" "$O/bf_u2.npy"; then pass; else fail "bf16: float32 inputs rounded on the fly differ from '<u2' inputs"; fi
ok "bf16 --out-float32" attend "${IN[@]}" --dtype bf16 --out-float32 -o "$O/bf_f4.npy"
npy "$O/bf_f4.npy" '<f4' '(40,4,32)'
within "bf16" "$O/bf_f4.npy" "$TOL_BF16"
# --out-float32 is the exact widening: the top 16 bits of each float are the bf16
values "$O/bf.npy" u2 $N >"$TMP/u2.txt"
values "$O/bf_f4.npy" u4 $N | awk '{ print int($1 / 65536) }' >"$TMP/top.txt"
if cmp -s "$TMP/u2.txt" "$TMP/top.txt"; then pass; else fail "bf16 --out-float32 is not the widened '<u2' output"; fi

# ---- fp16 ---------------------------------------------------------------------
ok "fp16 from float32 inputs" attend "${IN[@]}" --dtype fp16 -o "$O/hf.npy"
npy "$O/hf.npy" '<f2' '(40,4,32)'
ok "fp16 from '<f2' inputs" attend "${IN_F2[@]}" --dtype float16 -o "$O/hf_f2.npy"
if cmp -s "$O/hf.npy" "$O/hf_f2.npy"; then pass; else fail "fp16: float32 inputs rounded on the fly differ from '<f2' inputs"; fi
ok "fp16 --out-float32" attend "${IN[@]}" --dtype fp16 --out-float32 -o "$O/hf_f4.npy"
within "fp16" "$O/hf_f4.npy" "$TOL_FP16"
ok "'<f2' inputs with --dtype float32 (widened exactly)" attend "${IN_F2[@]}" -o "$O/f32_from_f2.npy"
npy "$O/f32_from_f2.npy" '<f4' '(40,4,32)'

# ---- backward, print -------------------------------------------------------------
ok "bf16 backward" attend "${IN[@]}" --dtype bf16 --grad-out "$FX/q.npy" --dq "$O/dq.npy" --dk "$O/dk.npy" \
    --dv "$O/dv.npy"
npy "$O/dq.npy" '<u2' '(40,4,32)'
npy "$O/dk.npy" '<u2' '(56,2,32)'
npy "$O/dv.npy" '<u2' '(56,2,32)'
ok "fp16 backward --out-float32" attend "${IN[@]}" --dtype fp16 --out-float32 --grad-out "$FX/q_f2.npy" \
    --dq "$O/dq4.npy" --dk "$O/dk4.npy" --dv "$O/dv4.npy"
npy "$O/dv4.npy" '<f4' '(56,2,32)'
# (A' is asked for, so this takes the portable half path, not the AVX512-BF16
# kernel: the same values up to float32 rounding, not the same bytes)
ok "bf16 --print" attend "${IN[@]}" --dtype bf16 -o "$O/bfp.npy" --print --out-float32
if grep -q "^Output O" "$TMP/stdout" && grep -qE "^q0 +0\.1209 +0\.0237" "$TMP/stdout"; then pass; else fail "bf16 --print"; fi
within "bf16 with --print" "$O/bfp.npy" "$TOL_BF16"

# ---- bad input: the file named, nothing written ----------------------------------
bad 1 "--k $FX/k_u2.npy: dtype uint16 ('<u2') holds bf16 bit patterns" \
    attend --q "$FX/q_f2.npy" --k "$FX/k_u2.npy" --v "$FX/v_f2.npy" --dtype fp16 -o "$TMP/out/o.npy"
bad 1 "--q $FX/q_u2.npy: dtype uint16 ('<u2')" attend --q "$FX/q_u2.npy" --k "$FX/k.npy" --v "$FX/v.npy" \
    -o "$TMP/out/o.npy"
bad 1 "--grad-out $FX/q_u2.npy" attend "${IN[@]}" --dtype fp16 --grad-out "$FX/q_u2.npy" --dq "$TMP/out/dq.npy" \
    --dk "$TMP/out/dk.npy" --dv "$TMP/out/dv.npy" -o "$TMP/out/o.npy"
bad 2 "--dtype: unknown type 'half'" attend "${IN[@]}" --dtype half -o "$TMP/out/o.npy"
bad 2 "--dtype: unknown type 'BF16'" attend "${IN[@]}" --dtype BF16 -o "$TMP/out/o.npy"
bad 2 "--out-float32: applies only with --dtype bf16 or fp16" attend "${IN[@]}" --out-float32 -o "$TMP/out/o.npy"
bad 1 "--key-lengths $FX/k_u2.npy: dtype uint16" attend "${IN[@]}" --dtype bf16 --key-lengths "$FX/k_u2.npy" \
    -o "$TMP/out/o.npy"

cli_finish
