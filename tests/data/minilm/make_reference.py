#!/usr/bin/env python3
"""Write the sentence-transformers reference for tests/test_minilm.c.

    python make_reference.py [MODEL_DIR] [--only sentences|retrieval]

MODEL_DIR is all-MiniLM-L6-v2 as scripts/fetch-model.sh puts it (default:
models/all-MiniLM-L6-v2 under the repository root). For every line of
sentences.txt (UTF-8, one sentence a line, an empty line is the empty text)
it writes, beside this script:

  token_ids.txt   the ids sentence-transformers' tokenizer gives the line
                  (its fast BertTokenizer, truncated to the model's
                  max_seq_length of 256 as encode() truncates), one line of
                  space-separated ids per sentence, [CLS] and [SEP] included
  embeddings.npy  float32 [sentences, 384]: SentenceTransformer.encode() of
                  each sentence alone (no padding), with the model's own
                  modules: mean pooling, then its Normalize module

and for retrieval.txt (100 pairs of paraphrases, 200 plain English
sentences: the set on which the int8 and bf16 encoders' nearest
neighbours are counted, docs/ENCODER.md "Precision"):

  retrieval_embeddings.npy  float32 [200, 384], encode() of each line alone
                  as above

--only writes just one of the two sets (both by default).

It asserts, for every line, that the fast tokenizer and transformers' Python
(slow) BertTokenizer give the same ids: qkv's tokenizer follows the slow
one, which the fast one differs from on a few rare inputs, so the sentences
must be ones where both agree. It also asserts that at least one sentence is
longer than max_seq_length, so that the truncation is checked.

Made with, in a virtual environment outside the repository (CPU):
  pip install torch==2.15.0 sentence-transformers==6.2.0 numpy==2.4.6
  (which brought transformers 5.24.0, tokenizers 0.23.3), Python 3.11.
"""
import os
import sys

import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def read_lines(name):
    with open(os.path.join(HERE, name), encoding="utf-8", newline="\n") as f:
        text = f.read()
    assert text.endswith("\n"), name + " must end with a newline"
    return text[:-1].split("\n")


def encode_each(model, sentences, rows):
    """encode() of each sentence alone, after checking its ids are rows'."""
    emb = []
    with torch.no_grad():
        for s, ids in zip(sentences, rows):
            feats = model.preprocess([s])
            assert feats["input_ids"][0].tolist() == ids
            e = model.encode([s], batch_size=1, convert_to_numpy=True, show_progress_bar=False)
            emb.append(e[0])
    emb = np.asarray(emb, dtype=np.float32)
    assert emb.shape == (len(sentences), 384), emb.shape
    norms = np.linalg.norm(emb.astype(np.float64), axis=1)
    assert np.all(np.abs(norms - 1) < 1e-5), "encode() did not normalise"
    return emb


def main():
    args = sys.argv[1:]
    only = None
    if "--only" in args:
        at = args.index("--only")
        assert at + 1 < len(args) and args[at + 1] in ("sentences", "retrieval"), "--only sentences|retrieval"
        only = args[at + 1]
        del args[at:at + 2]
    model_dir = args[0] if args else os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
    sentences = read_lines("sentences.txt")

    torch.manual_seed(0)
    model = SentenceTransformer(model_dir, device="cpu")
    model.eval()
    max_len = model.max_seq_length
    assert max_len == 256, max_len
    fast = model.tokenizer
    assert fast.is_fast, type(fast)
    slow_class = getattr(transformers, "BertTokenizerLegacy", None)  # transformers >= 5
    if slow_class is None:
        slow_class = transformers.BertTokenizer                      # transformers 4: the Python one
    slow = slow_class.from_pretrained(model_dir)
    assert not slow.is_fast, type(slow)

    if only != "sentences":
        retrieval = read_lines("retrieval.txt")
        assert len(retrieval) == 200 and all(retrieval), "retrieval.txt: 200 non-empty lines"
        ids = []
        for i, s in enumerate(retrieval):
            ids.append(fast(s, truncation=True, max_length=max_len)["input_ids"])
            assert ids[-1] == slow(s, truncation=True, max_length=max_len)["input_ids"], \
                "retrieval.txt line %d: the fast and slow tokenizers differ: %r" % (i + 1, s)
            assert len(fast(s)["input_ids"]) <= max_len, "retrieval.txt line %d is truncated" % (i + 1)
        np.save(os.path.join(HERE, "retrieval_embeddings.npy"), encode_each(model, retrieval, ids))
        print("retrieval: %d sentences, %d tokens in all" % (len(retrieval), sum(len(r) for r in ids)))
    if only == "retrieval":
        return

    rows = []
    truncated = 0
    for i, s in enumerate(sentences):
        ids = fast(s, truncation=True, max_length=max_len)["input_ids"]
        slow_ids = slow(s, truncation=True, max_length=max_len)["input_ids"]
        assert ids == slow_ids, "line %d: the fast and slow tokenizers differ: %r" % (i + 1, s)
        full = fast(s)["input_ids"]
        if len(full) > max_len:
            truncated += 1
            assert len(ids) == max_len and ids[-1] == fast.sep_token_id
        rows.append(ids)
    assert truncated >= 1, "no sentence longer than max_seq_length"

    # encode() tokenizes as above: encode_each checks that it is the same ids.
    emb = encode_each(model, sentences, rows)
    np.save(os.path.join(HERE, "embeddings.npy"), emb)
    with open(os.path.join(HERE, "token_ids.txt"), "w", encoding="ascii", newline="\n") as f:
        for ids in rows:
            f.write(" ".join(str(t) for t in ids) + "\n")
    print("%d sentences, %d truncated to %d tokens, %d tokens in all"
          % (len(sentences), truncated, max_len, sum(len(r) for r in rows)))


if __name__ == "__main__":
    main()
