#!/usr/bin/env bash
# Successful runs of `qkv mha`: every option on the torch fixtures of
# tests/data/cli/mha/, with the output files' dtype and shape read back from
# their .npy headers. The values themselves are compared with PyTorch's by
# tests/test_cli_mha.c.
# Usage: mha_ok.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init mha_ok "$@"
FX=$ROOT/tests/data/cli/mha

# ok NAME ARGS...: the run succeeds (exit 0, nothing on stdout or stderr).
ok() {
    local name=$1
    shift
    run "$@"
    if [ "$rc" -ne 0 ]; then
        fail "$name: exit $rc, want 0"
    elif [ -s "$TMP/stderr" ] || [ -s "$TMP/stdout" ]; then
        fail "$name: unexpected output"
    else
        pass
    fi
}

O=$TMP
SELF=(mha --weights "$FX/weights.safetensors" --prefix self. --heads 2)
CROSS=(mha --weights "$FX/weights.safetensors" --prefix cross. --heads 2)

# ---- help ------------------------------------------------------------------
run --help
if [ "$rc" -eq 0 ] && grep -qE "^ +mha " "$TMP/stdout"; then pass; else fail "qkv --help lists mha"; fi
run mha --help
if [ "$rc" -eq 0 ]; then pass; else fail "mha --help: exit $rc"; fi
for opt in --weights --heads --heads-kv --prefix --x --kv --k --v --causal --mask none causal \
    window:L,R causal-window:L --key-lengths --pos sinusoidal rope alibi --join concat mean \
    --rope-base -o --attn --impl auto reference --threads in_proj_weight q_proj_weight \
    k_proj_weight v_proj_weight in_proj_bias out_proj.weight out_proj.bias bias_k bias_v \
    additive.w1 additive.w2 additive.w; do
    if grep -qF -- "$opt" "$TMP/stdout"; then pass; else fail "mha --help does not mention $opt"; fi
done
run help mha
if [ "$rc" -eq 0 ] && grep -q "^Usage: qkv mha" "$TMP/stdout"; then pass; else fail "qkv help mha"; fi

# ---- self-attention: B = 2, n = 5, E = 8, H = 2 ----------------------------
ok "self" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y.npy"
npy "$O/y.npy" '<f4' '(2,5,8)'
ok "self --attn" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y2.npy" --attn "$O/a.npy"
npy "$O/a.npy" '<f4' '(2,2,5,5)'
same "the same y with and without --attn" "$O/y.npy" "$O/y2.npy"
ok "self again" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y3.npy"
same "deterministic" "$O/y.npy" "$O/y3.npy"
ok "overwrite an existing output" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y3.npy"
npy "$O/y3.npy" '<f4' '(2,5,8)'
ok "--causal" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yc.npy" --causal
ok "--mask causal" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yc2.npy" --mask causal
ok "--mask=causal" "${SELF[@]}" --x="$FX/x.npy" --out="$O/yc3.npy" --mask=causal
same "--causal is --mask causal" "$O/yc.npy" "$O/yc2.npy"
same "--opt=value" "$O/yc.npy" "$O/yc3.npy"
differ "causal changes the output" "$O/y.npy" "$O/yc.npy"
ok "--mask none" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yn.npy" --mask none
same "--mask none is the default" "$O/y.npy" "$O/yn.npy"
ok "--mask window:1,1" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yw.npy" --mask window:1,1 --attn "$O/aw.npy"
npy "$O/yw.npy" '<f4' '(2,5,8)'
npy "$O/aw.npy" '<f4' '(2,2,5,5)'
ok "--mask causal-window:1" "${SELF[@]}" --x "$FX/x.npy" -o "$O/ycw.npy" --mask causal-window:1
ok "--mask window:0,0" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yw0.npy" --mask window:0,0
ok "--key-lengths" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yp.npy" --key-lengths "$FX/lens.npy"
ok "--impl reference" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yr.npy" --impl reference
ok "--impl auto" "${SELF[@]}" --x "$FX/x.npy" -o "$O/ya.npy" --impl auto
ok "--impl fast" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yf.npy" --impl fast
ok "--threads 1" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yt1.npy" --threads 1
ok "--threads 4" "${SELF[@]}" --x "$FX/x.npy" -o "$O/yt4.npy" --threads 4
same "bitwise the same for any thread count" "$O/yt1.npy" "$O/yt4.npy"
ok "--pos none" "${SELF[@]}" --x "$FX/x.npy" -o "$O/ypn.npy" --pos none
same "--pos none is the default" "$O/y.npy" "$O/ypn.npy"

# ---- bias_k/bias_v (torch's add_bias_kv) and the additive score -----------
BKV=(mha --weights "$FX/bias_kv.safetensors" --heads 2)
ok "bias_k/bias_v --attn" "${BKV[@]}" --x "$FX/x.npy" -o "$O/ybkv.npy" --attn "$O/abkv.npy"
npy "$O/ybkv.npy" '<f4' '(2,5,8)'
npy "$O/abkv.npy" '<f4' '(2,2,5,6)'
ok "bias_k/bias_v rank 2 --causal --attn" "${BKV[@]}" --x "$FX/x1.npy" -o "$O/ybkv1.npy" --causal \
    --attn "$O/abkv1.npy"
npy "$O/abkv1.npy" '<f4' '(2,5,6)'
ok "bias_k/bias_v --threads 1" "${BKV[@]}" --x "$FX/x.npy" -o "$O/ybkv_t1.npy" --threads 1
ok "bias_k/bias_v --threads 3" "${BKV[@]}" --x "$FX/x.npy" -o "$O/ybkv_t3.npy" --threads 3
same "bias_k/bias_v: bitwise the same for any thread count" "$O/ybkv_t1.npy" "$O/ybkv_t3.npy"
ok "additive --attn" mha --weights "$FX/additive.safetensors" --heads 2 --x "$FX/x.npy" -o "$O/yadd.npy" \
    --attn "$O/aadd.npy"
npy "$O/aadd.npy" '<f4' '(2,2,5,5)'
ok "additive --pos alibi --causal" mha --weights "$FX/additive.safetensors" --heads 2 --x "$FX/x.npy" \
    -o "$O/yadd2.npy" --pos alibi --causal
differ "additive: ALiBi and causal change the output" "$O/yadd.npy" "$O/yadd2.npy"

# ---- rank 2: x [n, E] -----------------------------------------------------
ok "rank 2" "${SELF[@]}" --x "$FX/x1.npy" -o "$O/y_r2.npy" --attn "$O/a_r2.npy"
npy "$O/y_r2.npy" '<f4' '(5,8)'
npy "$O/a_r2.npy" '<f4' '(2,5,5)'
ok "rank 2 --key-lengths" "${SELF[@]}" --x "$FX/x1.npy" -o "$O/y_r2p.npy" --key-lengths "$FX/lens1.npy"
npy "$O/y_r2p.npy" '<f4' '(5,8)'

# ---- positional encodings -------------------------------------------------
for pos in sinusoidal rope alibi; do
    ok "--pos $pos" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y_$pos.npy" --pos $pos --attn "$O/a_$pos.npy"
    npy "$O/y_$pos.npy" '<f4' '(2,5,8)'
    npy "$O/a_$pos.npy" '<f4' '(2,2,5,5)'
    differ "--pos $pos changes the output" "$O/y.npy" "$O/y_$pos.npy"
    ok "--pos $pos rank 2 causal" "${SELF[@]}" --x "$FX/x1.npy" -o "$O/y2_$pos.npy" --pos $pos --causal
    npy "$O/y2_$pos.npy" '<f4' '(5,8)'
done
ok "--rope-base" "${SELF[@]}" --x "$FX/x.npy" -o "$O/y_rb.npy" --pos rope --rope-base 500
differ "--rope-base changes the output" "$O/y_rope.npy" "$O/y_rb.npy"
ok "--pos sinusoidal with cross inputs of dim != E" "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk.npy" \
    --v "$FX/cxv.npy" -o "$O/yc_sin.npy" --pos sinusoidal
npy "$O/yc_sin.npy" '<f4' '(2,5,8)'

# ---- cross-attention: n_k = 6, kdim = 6, vdim = 5 -------------------------
ok "cross" "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk.npy" --v "$FX/cxv.npy" -o "$O/cy.npy" \
    --attn "$O/ca.npy"
npy "$O/cy.npy" '<f4' '(2,5,8)'
npy "$O/ca.npy" '<f4' '(2,2,5,6)'
ok "cross rank 2" "${CROSS[@]}" --x "$FX/cx1.npy" --k "$FX/cxk1.npy" --v "$FX/cxv1.npy" \
    -o "$O/cy1.npy" --attn "$O/ca1.npy"
npy "$O/cy1.npy" '<f4' '(5,8)'
npy "$O/ca1.npy" '<f4' '(2,5,6)'
ok "cross --causal (aligned bottom-right)" "${CROSS[@]}" --x "$FX/cx.npy" --k "$FX/cxk.npy" \
    --v "$FX/cxv.npy" -o "$O/cyc.npy" --causal
ok "--kv" mha --weights "$FX/kv.safetensors" --heads 2 --x "$FX/x.npy" --kv "$FX/kv.npy" \
    -o "$O/ykv.npy" --attn "$O/akv.npy"
npy "$O/ykv.npy" '<f4' '(2,5,8)'
npy "$O/akv.npy" '<f4' '(2,2,5,6)'

# ---- other weight layouts -------------------------------------------------
ok "no biases" mha --weights "$FX/nobias.safetensors" --heads 2 --x "$FX/x.npy" -o "$O/ynb.npy"
ok "separate q/k/v of a fused layer" mha --weights "$FX/split.safetensors" --heads 2 --x "$FX/x.npy" \
    -o "$O/ysplit.npy"
same "separate q/k/v_proj_weight = in_proj_weight" "$O/y.npy" "$O/ysplit.npy"
ok "--join mean" mha --weights "$FX/mean.safetensors" --heads 2 --x "$FX/x.npy" -o "$O/ym.npy" \
    --join mean --attn "$O/am.npy"
npy "$O/ym.npy" '<f4' '(2,5,8)'
npy "$O/am.npy" '<f4' '(2,2,5,5)'
ok "grouped-query (H_kv from the weights)" mha --weights "$FX/gqa.safetensors" --heads 4 \
    --x "$FX/x.npy" -o "$O/yg.npy" --attn "$O/ag.npy"
npy "$O/yg.npy" '<f4' '(2,5,8)'
npy "$O/ag.npy" '<f4' '(2,4,5,5)'
ok "grouped-query --heads-kv 2" mha --weights "$FX/gqa.safetensors" --heads 4 --heads-kv 2 \
    --x "$FX/x.npy" -o "$O/yg2.npy"
same "--heads-kv 2 is what the weights say" "$O/yg.npy" "$O/yg2.npy"
ok "grouped-query --pos rope (Dh = 2)" mha --weights "$FX/gqa.safetensors" --heads 4 \
    --x "$FX/x.npy" -o "$O/ygr.npy" --pos rope --causal

cli_finish
