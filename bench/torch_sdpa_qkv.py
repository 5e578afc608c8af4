# qkv.torch.scaled_dot_product_attention beside torch's own
# F.scaled_dot_product_attention, in one run, alternating: forward, and
# forward + backward, medians in ms and the ratio torch / qkv. Also the cost
# of one call from Python at a tiny shape (what the wrapper adds over the C
# call is measured against the C library called through ctypes directly).
#
#   PYTHONPATH=python QKV_LIBRARY=build/libqkv.so QKV_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE \
#       python3 bench/torch_sdpa_qkv.py --n 512,1024,4096 --threads 2
#
# Needs PyTorch 2.x (pip, in a virtual environment) and NumPy; not part of
# the build or the tests.
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import qkv
import qkv.torch as qt


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


def per_call(fn, batches=15, calls=2000):
    """Seconds per call of fn: the fastest of `batches` batches of `calls`
    back-to-back calls (a batch's mean; the fastest is the one the shared
    machine disturbed least)."""
    fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="512,1024,4096")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print("torch %s, qkv %s, %d threads, B %d, H %d, D %d; medians over %d rounds x %d reps"
          % (torch.__version__, qkv.version(), a.threads, a.batch, a.heads, a.dim, a.rounds, a.reps))
    print("| pass | mask | n | qkv (ms) | torch (ms) | torch / qkv |")
    print("|---|---|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(1)
    for n in [int(x) for x in a.n.split(",")]:
        shape = (a.batch, a.heads, n, a.dim)
        q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
        for causal in (False, True):
            for passname in ("fwd", "fwd+bwd"):
                def run(sdpa):
                    if passname == "fwd":
                        with torch.no_grad():
                            sdpa(q, k, v, is_causal=causal)
                        return
                    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                    sdpa(qq, kk, vv, is_causal=causal).sum().backward()
                res = {"qkv": [], "torch": []}
                impls = (("qkv", qt.scaled_dot_product_attention), ("torch", F.scaled_dot_product_attention))
                for name, f in impls:   # warm-up, and a check that both agree
                    run(f)
                with torch.no_grad():
                    diff = (qt.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            - F.scaled_dot_product_attention(q, k, v, is_causal=causal)).abs().max().item()
                assert diff < 1e-4, diff
                for _ in range(a.rounds):
                    for name, f in impls:
                        res[name] += timed(lambda: run(f), a.reps)
                mq = statistics.median(res["qkv"]) * 1e3
                mt = statistics.median(res["torch"]) * 1e3
                print("| %s | %s | %d | %.2f | %.2f | %.2f× |"
                      % (passname, "causal" if causal else "none", n, mq, mt, mt / mq))

    # Per-call cost from Python at a tiny shape: qkv.torch (without and with
    # autograd) against the same C call made through ctypes with a prepared
    # descriptor (what the wrapper adds is the difference), each the fastest
    # of 15 batches of 2000 calls.
    import ctypes
    q = torch.randn(1, 1, 4, 8)
    out, lse = torch.empty(1, 1, 4, 8), torch.empty(1, 4)
    d = qkv._AttnDesc()
    qkv._desc_init(ctypes.byref(d))
    d.batch, d.n_q, d.n_k, d.heads, d.heads_kv, d.dim, d.dim_v = 1, 4, 4, 1, 1, 8, 8
    pd, qp, op, lp = ctypes.byref(d), q.data_ptr(), out.data_ptr(), lse.data_ptr()
    t_c = per_call(lambda: qkv._forward(pd, qp, qp, qp, op, None, lp))
    with torch.no_grad():
        t_py = per_call(lambda: qt.scaled_dot_product_attention(q, q, q))
    qg = q.clone().requires_grad_()
    t_ag = per_call(lambda: qt.scaled_dot_product_attention(qg, qg, qg))
    print("tiny call [1, 1, 4, 8]: C through ctypes %.1f us; qkv.torch %.1f us (+%.1f), "
          "with autograd %.1f us (+%.1f)" % (t_c * 1e6, t_py * 1e6, (t_py - t_c) * 1e6,
                                             t_ag * 1e6, (t_ag - t_c) * 1e6))

if __name__ == "__main__":
    main()
