"""A Hugging Face BERT, GPT-2, Llama, BART, Whisper or T5 with output_attentions=True: eager against qkv.hf.

Times the forward of a randomly initialised BertModel, GPT2Model, LlamaModel,
BartModel, WhisperModel or T5Model (--model; base sized by default: hidden
768, 12 heads, 12 layers, BART's, Whisper's and T5's split into 6 encoder and
6 decoder layers, BART's decoder fed the shifted input, T5's the input
itself, Whisper's encoder 30 s of 80 random mel bins (1,500 frames after its
convolutions) and its decoder --len tokens; Llama's key and value heads --kv-heads, its feed-forward
8/3 of the hidden size; --window W makes it a MistralModel with a sliding
window of W keys; nothing is downloaded) on a batch of random tokens, the
first sequence padded at its end (--no-padding: none), with output_attentions=True:
the model's eager attention, then the same model after qkv.hf.use_qkv,
alternating, the median of --reps calls each, for --rounds rounds. Also
prints how far the outputs and the attention maps of the two are apart.

Needs torch and transformers 4.49.0 (the newest qkv.hf supports) in a
virtual environment outside the repository, and a built libqkv.so:

    python3 -m venv VENV
    VENV/bin/pip install torch==2.15.0 transformers==4.49.0 numpy
    OMP_WAIT_POLICY=PASSIVE QKV_LIBRARY=build/libqkv.so VENV/bin/python bench/hf_attention.py

--only eager|qkv times one of the two (--rounds medians, no comparison): for
separate processes taking turns, where eager's swings within a process do
not land on one side.

--profile adds torch.profiler's table of one call through qkv (qkv's own
calls, through ctypes, are not listed: they are the time the table lacks).
"""
import argparse
import os
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
os.environ.setdefault("QKV_LIBRARY", os.path.join(here, "..", "build", "libqkv.so"))

import torch  # noqa: E402
import transformers  # noqa: E402

import qkv.hf  # noqa: E402


_MAPS = ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("bert", "gpt2", "llama", "bart", "whisper", "t5"), default="bert")
    ap.add_argument("--no-padding", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=("eager", "qkv"))
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.model == "bert":
        cfg = transformers.BertConfig(hidden_size=a.hidden, num_attention_heads=a.heads,
                                      num_hidden_layers=a.layers, intermediate_size=4 * a.hidden,
                                      max_position_embeddings=max(512, a.len),
                                      attn_implementation="eager")
        make = transformers.BertModel
    elif a.model in ("bart", "whisper"):
        kw = dict(d_model=a.hidden, encoder_attention_heads=a.heads, decoder_attention_heads=a.heads,
                  encoder_layers=a.layers // 2, decoder_layers=a.layers // 2,
                  encoder_ffn_dim=4 * a.hidden, decoder_ffn_dim=4 * a.hidden,
                  attn_implementation="eager")
        if a.model == "bart":
            cfg = transformers.BartConfig(max_position_embeddings=max(1024, a.len), **kw)
            make = transformers.BartModel
        else:
            cfg = transformers.WhisperConfig(max_target_positions=max(448, a.len), **kw)
            make = transformers.WhisperModel
    elif a.model == "t5":
        cfg = transformers.T5Config(d_model=a.hidden, num_heads=a.heads, d_kv=a.hidden // a.heads,
                                    num_layers=a.layers // 2, num_decoder_layers=a.layers // 2,
                                    d_ff=4 * a.hidden)
        make = transformers.T5Model
    elif a.model == "llama":
        kw = dict(hidden_size=a.hidden, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                  num_hidden_layers=a.layers, intermediate_size=(8 * a.hidden // 3 + 255) // 256 * 256,
                  max_position_embeddings=max(2048, a.len), attn_implementation="eager")
        if a.window:
            cfg, make = transformers.MistralConfig(sliding_window=a.window, **kw), transformers.MistralModel
        else:
            cfg, make = transformers.LlamaConfig(**kw), transformers.LlamaModel
    else:
        cfg = transformers.GPT2Config(n_embd=a.hidden, n_head=a.heads, n_layer=a.layers,
                                      n_positions=max(1024, a.len), attn_implementation="eager")
        make = transformers.GPT2Model
    torch.manual_seed(0)
    model = make(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.len))
    mask = torch.ones(a.batch, a.len, dtype=torch.long)
    if not a.no_padding:
        mask[0, a.len * 3 // 4:] = 0

    if a.model == "whisper":
        feats = torch.randn(a.batch, cfg.num_mel_bins, 2 * cfg.max_source_positions)
        inputs = dict(input_features=feats, decoder_input_ids=ids, decoder_attention_mask=mask)
    elif a.model == "t5":
        inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=ids,
                      decoder_attention_mask=mask)
    else:
        inputs = dict(input_ids=ids, attention_mask=mask)

    def timed():
        ts = []
        with torch.no_grad():
            for _ in range(a.reps):
                t0 = time.perf_counter()
                out = model(**inputs, output_attentions=True)
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts), out

    print("%s, torch %s, transformers %s, %d thread(s), batch %d x %d tokens%s, hidden %d, %d heads, "
          "%d layers, medians of %d calls" % (type(model).__name__, torch.__version__, transformers.__version__,
                                               a.threads, a.batch, a.len,
                                               "" if a.no_padding else " (the first padded)",
                                               a.hidden, a.heads, a.layers, a.reps))
    if a.only:
        if a.only == "qkv":
            qkv.hf.use_qkv(model)
        ts = [timed()[0] for _ in range(a.rounds)]
        print("%s: %s s (median %.3f s)" % (a.only, " ".join("%.3f" % t for t in ts),
                                           statistics.median(ts)))
        return
    for r in range(a.rounds):
        te, oe = timed()
        qkv.hf.use_qkv(model)
        tq, oq = timed()
        qkv.hf.restore(model)
        dh = (oe.last_hidden_state - oq.last_hidden_state).abs().max().item()
        da = max((x - y).abs().max().item() for k in _MAPS if getattr(oe, k, None) is not None
                 for x, y in zip(getattr(oe, k), getattr(oq, k)))
        print("round %d: eager %.3f s, qkv.hf %.3f s, eager / qkv %.2fx; max |diff| hidden %.1e, "
              "attentions %.1e" % (r + 1, te, tq, te / tq, dh, da))
    if a.profile:
        qkv.hf.use_qkv(model)
        with torch.no_grad(), torch.profiler.profile() as prof:
            model(**inputs, output_attentions=True)
        qkv.hf.restore(model)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
