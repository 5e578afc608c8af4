"""The peers of bench_encoder: sentence-transformers on PyTorch and ONNX
Runtime (fp32 and int8), timed as bench_encoder times qkv, printing the same
`key=value` line. Run by bench/encoder_vs_peers.sh inside the virtual
environment that bench/encoder_peers_setup.sh makes (outside the repository).

  python encoder_peers.py export --model DIR --out SCRATCH
      the ONNX files: model.onnx (torch's exporter), model_opt.onnx (ONNX
      Runtime's BERT optimizer: fused attention, bias + GELU, skip +
      LayerNorm), model_int8.onnx (dynamic quantisation of model_opt, int8
      weights per output channel).
  python encoder_peers.py run --peer st|ort|ort-int8 --model DIR [--onnx SCRATCH]
      --input FILE [--threads T] [--reps R] [--batch B] [--latency]
      [--save VECTORS.npy]
      Throughput: the whole file in one encode, median of R after a warm-up;
      --latency: one call per line, R rounds, the median call. ONNX Runtime
      gets the batches sentence-transformers would form, sorted by length and
      padded to the batch's longest (what its examples do), graph
      optimisations ALL, and the model's own pooling (mean, then L2).
"""
import argparse
import os
import statistics
import sys
import time


def export(args):
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    os.makedirs(args.out, exist_ok=True)
    m = transformers.AutoModel.from_pretrained(args.model, attn_implementation="eager").eval()
    cfg = m.config

    class Wrap(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask, types):
            return self.inner(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    ids = torch.ones(2, 8, dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {k: {0: "batch", 1: "tokens"} for k in names + ["last_hidden_state"]}
    plain = os.path.join(args.out, "model.onnx")
    torch.onnx.export(Wrap(m), (ids, ids, torch.zeros_like(ids)), plain, input_names=names,
                      output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)
    opt = optimizer.optimize_model(plain, model_type="bert", num_heads=cfg.num_attention_heads,
                                   hidden_size=cfg.hidden_size)
    opt.save_model_to_file(os.path.join(args.out, "model_opt.onnx"))
    print("fused:", {k: v for k, v in opt.get_fused_operator_statistics().items() if v})
    quantize_dynamic(os.path.join(args.out, "model_opt.onnx"), os.path.join(args.out, "model_int8.onnx"),
                     per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


class OrtEncoder:
    def __init__(self, path, model_dir, threads, batch):
        import onnxruntime as ort
        import transformers

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.batch = batch
        self.max_len = 256
        cfg = os.path.join(model_dir, "sentence_bert_config.json")
        if os.path.exists(cfg):
            import json
            self.max_len = json.load(open(cfg)).get("max_seq_length", 256)

    def encode(self, texts):
        import numpy as np

        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        parts = []
        for b in range(0, len(order), self.batch):
            idx = order[b:b + self.batch]
            enc = self.tok([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_len,
                           return_tensors="np")
            feed = {"input_ids": enc["input_ids"].astype(np.int64),
                    "attention_mask": enc["attention_mask"].astype(np.int64),
                    "token_type_ids": enc["token_type_ids"].astype(np.int64)}
            h = self.sess.run(None, feed)[0]
            m = feed["attention_mask"][:, :, None].astype(np.float32)
            v = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
            parts.append((idx, v))
        out = np.empty((len(texts), parts[0][1].shape[1]), dtype=np.float32)
        for idx, v in parts:
            out[idx] = v
        return out


def run(args):
    texts = open(args.input, encoding="utf-8").read().rstrip("\n").split("\n")
    texts = [t.rstrip("\r") for t in texts]
    if args.peer == "st":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(args.threads)
        st = SentenceTransformer(args.model, device="cpu")

        def encode(x):
            with torch.inference_mode():
                return st.encode(x, batch_size=args.batch, convert_to_numpy=True, normalize_embeddings=False)
    else:
        name = "model_int8.onnx" if args.peer == "ort-int8" else "model_opt.onnx"
        enc = OrtEncoder(os.path.join(args.onnx, name), args.model, args.threads, args.batch)
        encode = enc.encode
    vec = encode(texts)  # warm-up
    times = []
    if args.latency:
        for _ in range(args.reps):
            for t in texts:
                t0 = time.perf_counter()
                encode([t])
                times.append(time.perf_counter() - t0)
        print("peer=%s mode=latency threads=%d calls=%d median_ms=%.3f min_ms=%.3f max_ms=%.3f"
              % (args.peer, args.threads, len(times), 1e3 * statistics.median(times), 1e3 * min(times),
                 1e3 * max(times)))
    else:
        for _ in range(args.reps):
            t0 = time.perf_counter()
            vec = encode(texts)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print("peer=%s mode=throughput threads=%d sentences=%d median_s=%.3f min_s=%.3f max_s=%.3f "
              "sentences_per_s=%.1f" % (args.peer, args.threads, len(texts), med, min(times), max(times),
                                         len(texts) / med))
    if args.save:
        import numpy as np
        np.save(args.save, vec.astype(np.float32))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--peer", choices=["st", "ort", "ort-int8"], required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--onnx")
    r.add_argument("--input", required=True)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--latency", action="store_true")
    r.add_argument("--save")
    args = ap.parse_args()
    if args.cmd == "export":
        export(args)
    else:
        if args.peer != "st" and not args.onnx:
            ap.error("--onnx SCRATCH is needed for the ONNX Runtime peers (made by `export`)")
        run(args)


if __name__ == "__main__":
    main()
