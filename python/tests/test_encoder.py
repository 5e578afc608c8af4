"""Tests of qkv.Encoder on the tiny BERT model tests/data/encoder/tiny
(written by tests/data/encoder/make_tiny.py with the float64 outputs of
transformers beside it), as tests/test_encoder.c checks the C API.

Accuracy rule (the C test's): for every sentence, max |qkv - ref| <=
1e-5 * max |ref| over its token states, or over its pooled vector.

Run: python3 python/tests/test_encoder.py   (or python3 -m pytest python/tests;
the library as python/qkv says: $QKV_LIBRARY or the newest build*/libqkv.so)."""
import gc
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
from qkv_under_test import qkv  # noqa: E402  (the source tree's, or the installed one)

DATA = os.path.join(HERE, "..", "..", "tests", "data", "encoder")
TINY = os.path.join(DATA, "tiny")
TOL = 1e-5


def sentences():
    """The lines of sentences.txt that end with a newline (as the C test reads them)."""
    with open(os.path.join(DATA, "sentences.txt"), "rb") as f:
        return [line.decode("utf-8") for line in f.read().split(b"\n")[:-1]]


def expected(name):
    return np.load(os.path.join(TINY, "expected_%s.npy" % name))


def rel_err(got, ref):
    m = np.abs(ref).max()
    d = np.abs(np.asarray(got, np.float64) - ref).max()
    return d / m if m > 0 else d


def setUpModule():
    if not os.path.isfile(os.path.join(TINY, "model.safetensors")):
        raise RuntimeError("%s is missing: it is part of the source tree (git checkout "
                           "tests/data/encoder, or regenerate it with "
                           "tests/data/encoder/make_tiny.py)" % TINY)


class TestTinyModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.texts = sentences()
        cls.enc = qkv.Encoder(TINY)
        cls.ids = expected("ids")
        cls.off = expected("offsets")

    @classmethod
    def tearDownClass(cls):
        cls.enc.close()

    def check_rows(self, what, got, ref):
        """got and ref: one array per sentence."""
        self.assertEqual(len(got), len(ref), what)
        for s, (g, r) in enumerate(zip(got, ref)):
            self.assertEqual(g.shape, r.shape, "%s, sentence %d" % (what, s))
            self.assertEqual(g.dtype, np.float32)
            e = rel_err(g, r)
            self.assertLessEqual(e, TOL, "%s, sentence %d: relative error %.3g" % (what, s, e))

    def test_info(self):
        i = self.enc.info
        self.assertEqual((i["hidden"], i["layers"], i["heads"], i["intermediate"]), (16, 2, 4, 64))
        self.assertEqual((i["max_length"], i["max_positions"], i["vocab_size"]), (24, 40, 224))
        self.assertEqual((i["pooling"], i["normalize"], i["hidden_act"]), ("mean", True, "gelu"))
        i["hidden"] = 0  # a copy: the encoder is not changed
        self.assertEqual(self.enc.info["hidden"], 16)

    def test_tokenize(self):
        want = [self.ids[self.off[s]:self.off[s + 1]].tolist() for s in range(len(self.texts))]
        self.assertEqual(len(want), 6)
        self.assertEqual(self.enc.tokenize(self.texts), want)
        for s, t in enumerate(self.texts):
            self.assertEqual(self.enc.tokenize(t), want[s], "sentence %d" % s)
            self.assertEqual(self.enc.tokenize(t.encode("utf-8")), want[s],
                             "sentence %d as bytes" % s)
        self.assertEqual(self.enc.tokenize(self.texts[0], tokens=True),
                         ["[CLS]", "hello", ",", "i", "love", "you", "!", "[SEP]"])
        self.assertEqual(self.enc.tokenize([""], tokens=True), [["[CLS]", "[SEP]"]])
        self.assertEqual(self.enc.tokenize([]), [])
        # the long sentence is truncated to max_length, its last id [SEP]
        self.assertEqual(len(want[4]), 24)
        self.assertEqual(self.enc.tokenize(self.texts[4], tokens=True)[-1], "[SEP]")

    def test_token_states(self):
        ref = expected("gelu_states")
        refs = [ref[self.off[s]:self.off[s + 1]] for s in range(len(self.texts))]
        got = self.enc.encode(self.texts, pooling="none")
        self.check_rows("token states", got, refs)
        states, off = self.enc.token_states(self.texts)
        self.assertEqual(off.tolist(), self.off.tolist())
        self.assertEqual(states.shape, ref.shape)
        # Batches end to end: the same values to float rounding (a short call's
        # projections sum in another order); threads change no bit (below).
        close = dict(rtol=0, atol=1e-6 * float(np.abs(states).max()))
        for b in (1, 2, 4):
            s2, o2 = self.enc.token_states(self.texts, batch_size=b)
            self.assertEqual(o2.tolist(), self.off.tolist(), "batch_size %d" % b)
            np.testing.assert_allclose(s2, states, err_msg="batch_size %d" % b, **close)
        one = self.enc.encode(self.texts[0], pooling="none")
        np.testing.assert_allclose(one, got[0], **close)

    def test_pooled(self):
        for pool in ("mean", "cls", "max"):
            got = self.enc.encode(self.texts, pooling=pool, normalize=False)
            self.assertEqual(got.shape, (6, 16))
            self.check_rows(pool, list(got), list(expected("gelu_" + pool)))
        got = self.enc.encode(self.texts)  # the model's: mean, then normalised
        self.check_rows("embed", list(got), list(expected("gelu_embed")))
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6, rtol=0)
        self.assertTrue(np.array_equal(got, self.enc.encode(self.texts, pooling="mean",
                                                            normalize=True)))
        np.testing.assert_allclose(got, self.enc.encode(self.texts, batch_size=1), rtol=0, atol=1e-6)
        np.testing.assert_allclose(got[3], self.enc.encode(self.texts[3]), rtol=0, atol=1e-6)
        self.assertEqual(self.enc.encode([]).shape, (0, 16))

    def test_attentions(self):
        t = self.texts[0]
        a = self.enc.attentions(t)
        self.assertEqual(a.shape, (2, 4, 8, 8))
        self.assertEqual(a.dtype, np.float32)
        np.testing.assert_allclose(a.sum(axis=-1), 1.0, atol=1e-5, rtol=0)
        self.assertTrue((a >= 0).all())
        for layer in range(2):
            self.assertTrue((a[layer].max(axis=-1) > 2.0 / 8).any(), "layer %d is uniform" % layer)
            self.assertTrue(np.array_equal(self.enc.attentions(t, layer=layer), a[layer]))
        self.assertFalse(np.array_equal(a[0], a[1]))
        self.assertEqual(self.enc.attentions("", layer=1).shape, (4, 2, 2))

    def test_errors(self):
        with self.assertRaises(qkv.Error) as cm:
            qkv.Encoder("/nonexistent/qkv-model")
        self.assertEqual(cm.exception.status, 12)  # QKV_ERR_IO
        self.assertIn("/nonexistent/qkv-model", str(cm.exception))
        with self.assertRaises(qkv.Error) as cm:
            self.enc.encode(["fine", b"caf\xc3"])
        self.assertEqual(cm.exception.status, 13)  # QKV_ERR_FORMAT
        self.assertIn("text 1", cm.exception.why)
        self.assertIn("invalid UTF-8", cm.exception.why)
        with self.assertRaises(qkv.Error) as cm:  # the index counts from the list's start
            self.enc.encode(["a", "b", "c", b"\xff"], batch_size=2)
        self.assertIn("text 3", cm.exception.why)
        with self.assertRaises(qkv.Error) as cm:
            self.enc.encode([b"\xc0\xaf"], pooling="none")  # an overlong form
        self.assertEqual(cm.exception.status, 13)
        with self.assertRaises(qkv.Error) as cm:
            self.enc.tokenize(["ok", "lone \udc80 surrogate"])
        self.assertEqual(cm.exception.status, 13)
        self.assertIn("text 1", cm.exception.why)
        with self.assertRaises(qkv.Error) as cm:
            self.enc.attentions(b"\xed\xa0\x80")
        self.assertEqual(cm.exception.status, 13)
        for layer in (2, -1):
            with self.assertRaises(qkv.Error) as cm:
                self.enc.attentions("cat", layer=layer)
            self.assertEqual(cm.exception.status, 2)  # QKV_ERR_BAD_SIZE
            self.assertIn("layer %d" % layer, cm.exception.why)
        with self.assertRaises(qkv.Error) as cm:
            qkv.Encoder(TINY, max_length=41)
        self.assertIn("max_length", cm.exception.why)
        with self.assertRaises(ValueError):
            self.enc.encode(["a"], pooling="sum")
        with self.assertRaises(ValueError):
            self.enc.encode(["a"], pooling="none", normalize=True)
        with self.assertRaises(ValueError):
            self.enc.encode(["a"], batch_size=0)
        with self.assertRaises(TypeError):
            self.enc.encode(["a", 3])


class TestOptionsAndLifetime(unittest.TestCase):
    def test_threads_and_max_length(self):
        texts = sentences()
        with qkv.Encoder(TINY, threads=1) as e1, qkv.Encoder(TINY, threads=2) as e2:
            self.assertTrue(np.array_equal(e1.encode(texts), e2.encode(texts)))
            self.assertTrue(np.array_equal(e1.token_states(texts)[0], e2.token_states(texts)[0]))
        with qkv.Encoder(TINY, max_length=8) as e:
            self.assertEqual(e.info["max_length"], 8)
            ids = e.tokenize(texts)
            self.assertEqual(max(len(i) for i in ids), 8)
            self.assertEqual(e.attentions(texts[1]).shape, (2, 4, 8, 8))

    def test_precision(self):
        texts = sentences()
        with qkv.Encoder(TINY) as f:
            self.assertEqual(f.info["precision"], "fp32")
            a = f.encode(texts)
            for name, floor in (("bf16", 0.999), ("int8", 0.99)):
                with qkv.Encoder(TINY, precision=name) as q:
                    self.assertEqual(q.info["precision"], name)
                    b = q.encode(texts)
                cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                self.assertGreaterEqual(cos.min(), floor, "%s against fp32: cosine %.5f" % (name, cos.min()))
        with self.assertRaises(ValueError):
            qkv.Encoder(TINY, precision="int4")

    def test_close(self):
        with qkv.Encoder(TINY) as e:
            self.assertIn("hidden 16", repr(e))
        self.assertIn("closed", repr(e))
        for call in (lambda: e.encode(["a"]), lambda: e.tokenize("a"), lambda: e.attentions("a"),
                     lambda: e.token_states(["a"])):
            with self.assertRaises(ValueError):
                call()
        e.close()  # twice: harmless
        e2 = qkv.Encoder(TINY)
        del e2  # freed by __del__
        try:
            qkv.Encoder(os.path.join(TINY, "missing"))
        except qkv.Error:
            pass
        gc.collect()  # the half-made object's __del__ must not fail

    def test_other_activations(self):
        """gelu_new and relu: the same weights with config.json's hidden_act
        changed (as tests/test_encoder.c does), against their references."""
        texts = sentences()
        off = expected("offsets")
        tmp = tempfile.mkdtemp(prefix="qkv_py_encoder_")
        try:
            for act in ("gelu_new", "relu"):
                d = os.path.join(tmp, act)
                shutil.copytree(TINY, d, ignore=shutil.ignore_patterns("expected_*"))
                cfg = os.path.join(d, "config.json")
                with open(cfg) as f:
                    text = f.read()
                self.assertIn('"hidden_act": "gelu"', text)
                with open(cfg, "w") as f:
                    f.write(text.replace('"hidden_act": "gelu"', '"hidden_act": "%s"' % act))
                with qkv.Encoder(d) as e:
                    self.assertEqual(e.info["hidden_act"], act)
                    ref = expected(act + "_states")
                    got = e.encode(texts, pooling="none")
                    for s in range(len(texts)):
                        err = rel_err(got[s], ref[off[s]:off[s + 1]])
                        self.assertLessEqual(err, TOL, "%s states, sentence %d: %.3g"
                                             % (act, s, err))
                    for pool in ("mean", "cls", "max"):
                        got = e.encode(texts, pooling=pool, normalize=False)
                        ref = expected("%s_%s" % (act, pool))
                        for s in range(len(texts)):
                            err = rel_err(got[s], ref[s])
                            self.assertLessEqual(err, TOL, "%s %s, sentence %d: %.3g"
                                                 % (act, pool, s, err))
                    got = e.encode(texts)
                    ref = expected(act + "_embed")
                    for s in range(len(texts)):
                        self.assertLessEqual(rel_err(got[s], ref[s]), TOL, "%s embed %d" % (act, s))
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(verbosity=2)
