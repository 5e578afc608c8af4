#!/usr/bin/env python3
"""Writes the attention maps that transformers gives for the tiny model of
tests/data/encoder/tiny (made by make_tiny.py, read here, never changed),
for tests/test_encoder_attention.c and tests/cli/show_model.sh.

Needs torch and transformers (pip install torch transformers numpy, in a
virtual environment outside the repository):

    python3 tests/data/encoder/make_attention.py

For lines 0, 1 and 4 of sentences.txt ("Hello, I love you!", a sentence of
a dozen words, and one cut at the model's 24 tokens), each run alone with
output_attentions=True (the eager attention, in float64):
  expected_attention_s<line>.npy  float64 [layers, heads, n, n]: row i of
                                  map [l, h] is how token i weighs token j
"""
import os

import numpy as np
import torch
from transformers import BertModel, BertTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "tiny")
MAX_SEQ = 24  # sentence_bert_config.json's max_seq_length
LINES = (0, 1, 4)


def main():
    tok = BertTokenizer(os.path.join(MODEL, "vocab.txt"), do_lower_case=True)
    with open(os.path.join(HERE, "sentences.txt"), encoding="utf-8") as f:
        sentences = f.read().split("\n")[:-1]
    model = BertModel.from_pretrained(MODEL, add_pooling_layer=False, attn_implementation="eager")
    model = model.double().eval()
    for line in LINES:
        ids = tok(sentences[line], truncation=True, max_length=MAX_SEQ)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model(input_ids=x, token_type_ids=torch.zeros_like(x), output_attentions=True)
        maps = np.stack([a[0].numpy() for a in out.attentions])  # [layers, heads, n, n]
        np.save(os.path.join(HERE, "expected_attention_s%d.npy" % line), maps.astype(np.float64))


if __name__ == "__main__":
    main()
