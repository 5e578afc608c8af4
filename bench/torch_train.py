# PyTorch's equivalent of bench/bench_train.c, for the throughput comparison
# in docs/TRAINING.md and docs/BENCHMARKS.md: python3 bench/torch_train.py THREADS
# (needs pip's torch; not part of the build or the tests).
import math, sys, time, torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
L, E, H, n, B, V, steps = 4, 128, 4, 128, 16, 64, 20
class M(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = torch.nn.Embedding(V, E)
        pe = torch.zeros(n, E); pos = torch.arange(n).unsqueeze(1)
        div = torch.exp(torch.arange(0, E, 2) * (-math.log(10000.0) / E))
        pe[:, 0::2] = torch.sin(pos * div); pe[:, 1::2] = torch.cos(pos * div)
        s.register_buffer("pe", pe)
        layer = torch.nn.TransformerEncoderLayer(E, H, 4 * E, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        s.blocks = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=False)
        s.ln = torch.nn.LayerNorm(E)
    def forward(s, x):
        h = s.emb(x) * math.sqrt(E) + s.pe
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n)
        h = s.blocks(h, mask=mask, is_causal=True)
        return s.ln(h) @ s.emb.weight.T
m = M(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
x = (torch.arange(B * n) * 2654435761 % V).view(B, n); y = torch.roll(x.view(-1), -1).view(B, n)
ts = []
for s in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(m(x).view(-1, V), y.view(-1)); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    ts.append(time.perf_counter() - t0)
med = sorted(ts[2:])[len(ts[2:]) // 2]
print(f"torch {torch.__version__}: threads={torch.get_num_threads()} {sum(p.numel() for p in m.parameters())} parameters, median step {med*1e3:.1f} ms, {B*n/med:.0f} tokens/s (loss {loss.item():.3f})")
