#!/usr/bin/env python3
"""Writes tests/data/encoder/tiny/: a tiny randomly initialised BertModel in
the layout of a sentence-transformers model directory, and the float64
outputs of transformers for the sentences of sentences.txt, for
tests/test_encoder.c.

Needs torch and transformers (pip install torch transformers, in a virtual
environment outside the repository):

    python3 tests/data/encoder/make_tiny.py

The model: hidden 16, 2 layers, 4 heads of 4, intermediate 64, a vocab of a
few hundred tokens (written here), 40 positions, 2 token types; every
weight, bias and LayerNorm parameter drawn at random (a larger spread than
BERT's initialisation, so attention is far from uniform and LayerNorm's
scale and shift matter). sentence_bert_config.json truncates at 24 tokens.

Expected outputs (.npy, float64), for each of hidden_act gelu (the model as
saved), gelu_new and relu (same weights, config.json changed by the test):
  expected_<act>_states.npy  [tokens of all sentences, hidden]: the last
                             hidden state of each sentence run alone, end to end
  expected_<act>_mean.npy, _cls.npy, _max.npy  [sentences, hidden]: pooled
                             (mean over all tokens, the [CLS] token, max)
  expected_<act>_embed.npy   [sentences, hidden]: mean then L2-normalised,
                             what sentence-transformers returns for this model
  expected_ids.npy (int64)   the token ids, end to end
  expected_offsets.npy (int64) [sentences + 1]: where each sentence starts
"""
import json
import os
import shutil

import numpy as np
import torch
from transformers import BertConfig, BertModel, BertTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tiny")
MAX_SEQ = 24

WORDS = """the a an and or of to in on at for with is are was be i you he she it we they
me my your his her its our their this that these those hello hi love like see look
quick brown fox jump over lazy dog cat bird fish tree house car road city sun moon
star sky sea water fire earth air day night time year word sentence model attention
head layer token query key value matrix vector weight sum soft max mean all need
what who why how when where not no yes one two three four five six seven eight nine
ten run walk talk read write think know say go come make take give get find good bad
big small long short new old first last red green blue black white happy sad""".split()
PIECES = "ing ed s es er est ly tion al ness".split()
PUNCT = list(".,!?;:'\"()-")


def vocab_tokens():
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    toks += PUNCT + [str(d) for d in range(10)]
    toks += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    toks += ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    toks += ["##" + p for p in PIECES]
    seen = set()
    out = []
    for t in toks + WORDS:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def randomise(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "1_Pooling"))
    toks = vocab_tokens()
    with open(os.path.join(OUT, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(toks) + "\n")

    cfg = BertConfig(vocab_size=len(toks), hidden_size=16, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, hidden_act="gelu",
                     max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12,
                     position_embedding_type="absolute")
    torch.manual_seed(22)
    gen = torch.Generator().manual_seed(1234)
    model = BertModel(cfg, add_pooling_layer=False)
    randomise(model, gen)
    model.save_pretrained(OUT, safe_serialization=True)

    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer",
                   "model_max_length": 40}, f, indent=2)
    with open(os.path.join(OUT, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": MAX_SEQ, "do_lower_case": False}, f, indent=2)
    with open(os.path.join(OUT, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  f, indent=2)
    with open(os.path.join(OUT, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": 16, "pooling_mode_cls_token": False,
                   "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                   "pooling_mode_mean_sqrt_len_tokens": False}, f, indent=2)

    tok = BertTokenizer(os.path.join(OUT, "vocab.txt"), do_lower_case=True)
    with open(os.path.join(HERE, "sentences.txt"), encoding="utf-8") as f:
        sentences = f.read().split("\n")[:-1]
    ids, offsets = [], [0]
    for s in sentences:
        e = tok(s, truncation=True, max_length=MAX_SEQ)["input_ids"]
        ids += e
        offsets.append(len(ids))
    np.save(os.path.join(OUT, "expected_ids.npy"), np.array(ids, dtype=np.int64))
    np.save(os.path.join(OUT, "expected_offsets.npy"), np.array(offsets, dtype=np.int64))

    for act in ("gelu", "gelu_new", "relu"):
        c = BertConfig.from_pretrained(OUT)
        c.hidden_act = act
        m = BertModel.from_pretrained(OUT, config=c, add_pooling_layer=False).double().eval()
        states, mean, cls, mx = [], [], [], []
        with torch.no_grad():
            for i in range(len(sentences)):
                x = torch.tensor([ids[offsets[i]:offsets[i + 1]]])
                h = m(input_ids=x, token_type_ids=torch.zeros_like(x)).last_hidden_state[0]
                states.append(h.numpy())
                mean.append(h.mean(0).numpy())
                cls.append(h[0].numpy())
                mx.append(h.max(0).values.numpy())
        mean = np.array(mean)
        embed = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        for nm, a in (("states", np.concatenate(states)), ("mean", mean), ("cls", np.array(cls)),
                      ("max", np.array(mx)), ("embed", embed)):
            np.save(os.path.join(OUT, "expected_%s_%s.npy" % (act, nm)), a.astype(np.float64))


if __name__ == "__main__":
    main()
