#!/usr/bin/env bash
# Successful runs of `qkv attend`: forward and backward on the articles'
# four-word example, every option, rank 2/3/4 inputs and grouped-query
# attention, with the output files' dtype and shape read back from their .npy
# headers and known answers checked through --print.
# Usage: attend_ok.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init attend_ok "$@"
EX=$ROOT/examples/data
FX=$ROOT/tests/data/cli

# ok NAME ARGS...: the run succeeds (exit 0, nothing on stderr).
ok() {
    local name=$1
    shift
    run "$@"
    if [ "$rc" -ne 0 ]; then
        fail "$name: exit $rc, want 0"
    elif [ -s "$TMP/stderr" ]; then
        fail "$name: unexpected stderr"
    else
        pass
    fi
}

# has NAME PATTERN: stdout has a line matching the extended regex PATTERN.
has() {
    if grep -qE -- "$2" "$TMP/stdout"; then
        pass
    else
        fail "$1: stdout has no line matching '$2'"
        sed 's/^/    stdout: /' "$TMP/stdout" >&2
    fi
}

HQ=(--q "$EX/hello_q.npy" --k "$EX/hello_k.npy" --v "$EX/hello_v.npy")
O=$TMP

# ---- the program ----------------------------------------------------------
run --version
if [ "$rc" -eq 0 ] && [ "$(cat "$TMP/stdout")" = "qkv 0.1.0" ]; then pass; else fail "--version"; fi
run --help
if [ "$rc" -eq 0 ] && grep -q "attend" "$TMP/stdout"; then pass; else fail "--help"; fi
run attend --help
if [ "$rc" -eq 0 ]; then pass; else fail "attend --help: exit $rc"; fi
for opt in --q --k --v -o --mask none causal window:L,R causal-window:L --score scaled dot \
    cosine --scale --temperature --norm softmax relu sigmoid --relu-count --softcap \
    --key-lengths --seq-offsets --bias --attn --lse --dtype float32 float64 --impl auto \
    reference --threads --print --grad-out --dq --dk --dv --dbias; do
    if grep -qF -- "$opt" "$TMP/stdout"; then pass; else fail "attend --help does not mention $opt"; fi
done

# ---- forward on the four-word example -------------------------------------
ok "hello forward" attend "${HQ[@]}" -o "$O/out.npy"
npy "$O/out.npy" '<f4' '(4,4)'
ok "hello --attn --lse" attend "${HQ[@]}" -o "$O/out2.npy" --attn "$O/attn.npy" --lse "$O/lse.npy"
npy "$O/attn.npy" '<f4' '(4,4)'
npy "$O/lse.npy" '<f4' '(4,)'
same "the same output with and without --attn" "$O/out.npy" "$O/out2.npy"
ok "hello again" attend "${HQ[@]}" -o "$O/out3.npy"
same "deterministic" "$O/out.npy" "$O/out3.npy"
ok "--threads 1" attend "${HQ[@]}" -o "$O/out_t1.npy" --threads 1
ok "--threads 4" attend "${HQ[@]}" -o "$O/out_t4.npy" --threads 4
same "bitwise the same for any thread count" "$O/out_t1.npy" "$O/out_t4.npy"
ok "--impl reference" attend "${HQ[@]}" -o "$O/out_ref.npy" --impl reference
ok "--impl auto" attend "${HQ[@]}" -o "$O/out_auto.npy" --impl auto
ok "--impl fast" attend "${HQ[@]}" -o "$O/out_fast.npy" --impl fast
same "auto is the fast path for float32 softmax" "$O/out_auto.npy" "$O/out_fast.npy"
ok "--dtype float64" attend "${HQ[@]}" -o "$O/out64.npy" --dtype float64 --attn "$O/attn64.npy"
npy "$O/out64.npy" '<f8' '(4,4)'
npy "$O/attn64.npy" '<f8' '(4,4)'
ok "overwrite an existing output" attend "${HQ[@]}" -o "$O/out.npy"
npy "$O/out.npy" '<f4' '(4,4)'

# --print: the matrix of the articles' figure 1 (see examples/data/make_hello.py)
ok "hello --print" attend "${HQ[@]}" -o "$O/outp.npy" --print
has "--print heading" "^Attention weights A'"
has "--print row Hello" "^q0 +0\.2676 +0\.5447 +0\.1099 +0\.0778$"
has "--print row love" "^q2 +0\.0582 +0\.6126 +0\.2098 +0\.1193$"
has "--print output table" "^Output O"
npy "$O/outp.npy" '<f4' '(4,4)'

# Known answers: q = 0 gives every visible key the same weight; v[j] = [j, 2j].
ok "uniform" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" -o "$O/u.npy" --print
has "uniform weights" "^q3 +0\.2500 +0\.2500 +0\.2500 +0\.2500$"
has "uniform output" "^q3 +1\.5000 +3\.0000$"
npy "$O/u.npy" '<f4' '(4,2)'
ok "causal" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" -o "$O/c.npy" \
    --mask causal --print
has "causal row 0" "^q0 +1\.0000 +0\.0000 +0\.0000 +0\.0000$"
has "causal row 1" "^q1 +0\.5000 +0\.5000 +0\.0000 +0\.0000$"
has "causal output row 1" "^q1 +0\.5000 +1\.0000$"
ok "window:1,0" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" -o "$O/w.npy" \
    --mask window:1,0 --print
has "window row 3" "^q3 +0\.0000 +0\.0000 +0\.5000 +0\.5000$"
ok "causal-window:0" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" \
    -o "$O/cw.npy" --mask=causal-window:0 --print
has "causal-window:0 sees itself only" "^q2 +0\.0000 +0\.0000 +1\.0000 +0\.0000$"
ok "key lengths" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" -o "$O/kl.npy" \
    --key-lengths "$FX/lens1.npy" --print
has "key lengths [3]" "^q0 +0\.3333 +0\.3333 +0\.3333 +0\.0000$"
ok "packed sequences" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" \
    -o "$O/so.npy" --seq-offsets "$FX/offsets.npy" --print
has "sequence [0, 1)" "^q0 +1\.0000 +0\.0000 +0\.0000 +0\.0000$"
has "sequence [1, 4)" "^q2 +0\.0000 +0\.3333 +0\.3333 +0\.3333$"
ok "relu divided by count" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" \
    -o "$O/r.npy" --norm relu --relu-count --print
has "relu of 0 is 0" "^q0 +0\.0000 +0\.0000 +0\.0000 +0\.0000$"
ok "sigmoid" attend --q "$FX/zeros_q.npy" --k "$EX/hello_k.npy" --v "$FX/vidx.npy" -o "$O/s.npy" \
    --norm sigmoid --print
has "sigmoid of 0 is 1/2" "^q0 +0\.5000 +0\.5000 +0\.5000 +0\.5000$"

# the other options, each on its own
ok "--score dot" attend "${HQ[@]}" -o "$O/o1.npy" --score dot
ok "--score cosine --temperature" attend "${HQ[@]}" -o "$O/o2.npy" --score cosine --temperature 0.5
ok "--scale" attend "${HQ[@]}" -o "$O/o3.npy" --score scaled --scale 0.25
ok "--softcap" attend "${HQ[@]}" -o "$O/o4.npy" --softcap 5
ok "--norm softmax" attend "${HQ[@]}" -o "$O/o5.npy" --norm softmax --mask none
ok "--bias" attend "${HQ[@]}" -o "$O/o6.npy" --bias "$FX/bias2.npy"
ok "--out" attend "${HQ[@]}" --out "$O/o7.npy"
npy "$O/o7.npy" '<f4' '(4,4)'
ok "--print truncates" attend --q "$FX/long.npy" --k "$FX/long.npy" --v "$FX/long.npy" -o "$O/l.npy" --print
has "truncation note" "truncated: showing 16 of 20 rows and 16 of 20 columns"

# ---- backward --------------------------------------------------------------
ok "hello backward" attend "${HQ[@]}" --grad-out "$FX/dout2.npy" --dq "$O/dq.npy" --dk "$O/dk.npy" \
    --dv "$O/dv.npy"
npy "$O/dq.npy" '<f4' '(4,4)'
npy "$O/dk.npy" '<f4' '(4,4)'
npy "$O/dv.npy" '<f4' '(4,4)'
ok "backward with -o, --bias, --dbias" attend "${HQ[@]}" --bias "$FX/bias2.npy" -o "$O/bo.npy" \
    --grad-out "$FX/dout2.npy" --dq "$O/dq2.npy" --dk "$O/dk2.npy" --dv "$O/dv2.npy" \
    --dbias "$O/dbias.npy" --mask causal
npy "$O/bo.npy" '<f4' '(4,4)'
npy "$O/dbias.npy" '<f4' '(4,4)'
ok "backward float64" attend "${HQ[@]}" --grad-out "$FX/dout2.npy" --dq "$O/dq64.npy" \
    --dk "$O/dk64.npy" --dv "$O/dv64.npy" --dtype float64
npy "$O/dq64.npy" '<f8' '(4,4)'

# ---- rank 3: n_q = 4, n_k = 5, H = 2, D = 4, D_v = 3 ----------------------
R3=(--q "$FX/q3.npy" --k "$FX/k3.npy" --v "$FX/v3.npy")
ok "rank 3" attend "${R3[@]}" -o "$O/o3r.npy" --attn "$O/a3.npy" --lse "$O/l3.npy" --print
npy "$O/o3r.npy" '<f4' '(4,2,3)'
npy "$O/a3.npy" '<f4' '(2,4,5)'
npy "$O/l3.npy" '<f4' '(2,4)'
has "rank 3 heading" "^head 1:$"
ok "rank 3 per-head bias, backward" attend "${R3[@]}" --bias "$FX/bias3.npy" --grad-out "$FX/dout3.npy" \
    --dq "$O/dq3.npy" --dk "$O/dk3.npy" --dv "$O/dv3.npy" --dbias "$O/db3.npy" --mask causal
npy "$O/dq3.npy" '<f4' '(4,2,4)'
npy "$O/dk3.npy" '<f4' '(5,2,4)'
npy "$O/dv3.npy" '<f4' '(5,2,3)'
npy "$O/db3.npy" '<f4' '(2,4,5)'

# ---- grouped-query attention: 4 query heads over 2 key/value heads ---------
G3=(--q "$FX/q3h4.npy" --k "$FX/k3.npy" --v "$FX/v3.npy")
ok "GQA" attend "${G3[@]}" -o "$O/og.npy" --attn "$O/ag.npy"
npy "$O/og.npy" '<f4' '(4,4,3)'
npy "$O/ag.npy" '<f4' '(4,4,5)'
ok "GQA backward" attend "${G3[@]}" --grad-out "$FX/dout3h4.npy" --dq "$O/dqg.npy" --dk "$O/dkg.npy" \
    --dv "$O/dvg.npy" --mask window:1,1
npy "$O/dqg.npy" '<f4' '(4,4,4)'
npy "$O/dkg.npy" '<f4' '(5,2,4)'
npy "$O/dvg.npy" '<f4' '(5,2,3)'

# ---- rank 4: B = 2, n = 3, H = 2, H_kv = 1, float64 queries ----------------
R4=(--q "$FX/q4.npy" --k "$FX/k4.npy" --v "$FX/v4.npy")
ok "rank 4" attend "${R4[@]}" -o "$O/o4r.npy" --attn "$O/a4.npy" --lse "$O/l4.npy" \
    --key-lengths "$FX/lens4.npy" --print
npy "$O/o4r.npy" '<f4' '(2,3,2,4)'
npy "$O/a4.npy" '<f4' '(2,2,3,3)'
npy "$O/l4.npy" '<f4' '(2,2,3)'
has "rank 4 heading" "^batch 1, head 1:$"
# key length 1 in batch 1: every query sees key 0 only
if grep -A2 -m1 "^batch 1, head 0:$" "$TMP/stdout" | grep -qE "^q0 +1\.0000 +0\.0000 +0\.0000$"; then
    pass
else
    fail "rank 4: batch 1 (key length 1) should put all weight on key 0"
fi
ok "rank 4 backward float64" attend "${R4[@]}" --grad-out "$FX/dout4.npy" --dq "$O/dq4.npy" \
    --dk "$O/dk4.npy" --dv "$O/dv4.npy" --dtype float64 --mask causal
npy "$O/dq4.npy" '<f8' '(2,3,2,4)'
npy "$O/dk4.npy" '<f8' '(2,3,1,4)'
npy "$O/dv4.npy" '<f8' '(2,3,1,4)'

cli_finish
