#!/usr/bin/env python3
"""Write the sentence-transformers reference for tests/test_minilm.c.

    python make_reference.py [MODEL_DIR]

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


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
    with open(os.path.join(HERE, "sentences.txt"), encoding="utf-8", newline="\n") as f:
        text = f.read()
    assert text.endswith("\n"), "sentences.txt must end with a newline"
    sentences = text[:-1].split("\n")

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

    emb = []
    with torch.no_grad():
        for s, ids in zip(sentences, rows):
            # encode() tokenizes as above: check that it is the same ids.
            feats = model.preprocess([s])
            assert feats["input_ids"][0].tolist() == ids
            e = model.encode([s], batch_size=1, convert_to_numpy=True, show_progress_bar=False)
            emb.append(e[0])
    emb = np.asarray(emb, dtype=np.float32)
    assert emb.shape == (len(sentences), 384), emb.shape
    norms = np.linalg.norm(emb.astype(np.float64), axis=1)
    assert np.all(np.abs(norms - 1) < 1e-5), "encode() did not normalise"

    np.save(os.path.join(HERE, "embeddings.npy"), emb)
    with open(os.path.join(HERE, "token_ids.txt"), "w", encoding="ascii", newline="\n") as f:
        for ids in rows:
            f.write(" ".join(str(t) for t in ids) + "\n")
    print("%d sentences, %d truncated to %d tokens, %d tokens in all"
          % (len(sentences), truncated, max_len, sum(len(r) for r in rows)))


if __name__ == "__main__":
    main()
