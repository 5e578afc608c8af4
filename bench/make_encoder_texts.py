"""The encoder benchmark's workloads, made the same way every time (stdlib
only): words drawn with a fixed seed from the model's own vocabulary.

  python3 make_encoder_texts.py VOCAB.txt OUTDIR
writes OUTDIR/a.txt (2,048 short sentences, 6-37 tokens, mean 21.5, with
all-MiniLM-L6-v2's tokenizer), b.txt (256 texts cut at 256 tokens) and
c.txt (one sentence of 10 tokens with [CLS] and [SEP])."""
import os
import random
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    vocab = [l.rstrip("\n") for l in open(sys.argv[1], encoding="utf-8")]
    words = [w for w in vocab if w.isalpha() and w.isascii() and len(w) > 2 and not w.startswith("[")]
    r = random.Random(12345)
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "a.txt"), "w") as f:
        for _ in range(2048):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(3, 34))).capitalize() + ".\n")
    with open(os.path.join(out, "b.txt"), "w") as f:
        for _ in range(256):
            f.write(" ".join(r.choice(words) for _ in range(300)).capitalize() + ".\n")
    with open(os.path.join(out, "c.txt"), "w") as f:
        f.write("The cat sat quietly on the mat.\n")


if __name__ == "__main__":
    main()
