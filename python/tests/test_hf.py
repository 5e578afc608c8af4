"""Tests of qkv.hf: tiny random transformers BertModel, its kin (RoBERTa,
XLM-RoBERTa, CamemBERT, ELECTRA), DistilBertModel, GPT2Model, ViTModel and its
kin (DeiT, DINOv2, ViT-MSN, YOLOS, AST, ViViT), BartModel and its kin
(mBART, Pegasus, Marian, Blenderbot, PLBart, BioGPT, Speech2Text), Whisper,
T5, mT5, CLIP, CLIPSeg, SigLIP, and with
transformers 4.48 on LlamaModel and the decoders whose attention is Llama's
(built from configs, nothing downloaded) whose self-attention runs through qkv,
against the same models' eager attention: last_hidden_state and every
output_attentions tensor within 1e-5 (float32) and 1e-10 (float64), with a
padding mask (a batch of 2, one sequence padded at its end; another at its
start), the gradients of the
input embeddings within 1e-5 (float64), GPT-2's key/value cache, the
models built with attn_implementation="sdpa" (their other masks; on torch
>= 2.1.1, where transformers builds them), restore(), and the errors.

Needs PyTorch and transformers (tests/python_hf.sh makes a venv with the
pinned transformers). Run: python3 python/tests/test_hf.py (the library as
python/qkv says: $QKV_LIBRARY or the newest build*/libqkv.so)."""
import copy
import unittest

import torch
import transformers

from qkv_under_test import qkv  # noqa: E402
import qkv.hf  # noqa: E402
import qkv.torch  # noqa: E402

B, L, VOCAB = 2, 7, 100


def bert(dtype, impl="eager"):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=VOCAB,
                                  attn_implementation=impl)
    return transformers.BertModel(cfg).to(dtype).eval()


def bert_kin(name):
    """A maker like bert's for a model whose self-attention transformers
    copies from BERT's (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA)."""
    def make(dtype, impl="eager"):
        torch.manual_seed(0)
        cfg = getattr(transformers, name + "Config")(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            vocab_size=VOCAB, attn_implementation=impl, **({"embedding_size": 32} if name == "Electra" else {}))
        return getattr(transformers, name + "Model")(cfg).to(dtype).eval()
    make.__name__ = name
    return make


KIN = ("Roberta", "XLMRoberta", "Camembert", "Electra")


def distilbert(dtype, impl="eager"):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=VOCAB,
                                        attn_implementation=impl)
    return transformers.DistilBertModel(cfg).to(dtype).eval()


def gpt2(dtype, cls=transformers.GPT2Model, impl="eager"):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  attn_implementation=impl)
    return cls(cfg).to(dtype).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, L - 3:] = 0          # the second sequence is padded (its last 3 tokens)
    return ids, mask


def maxdiff(a, b):
    return (a - b).abs().max().item()


class Watching:
    """Records the calls of qkv.torch's attention (_sdpa, what
    scaled_dot_product_attention and qkv.hf call) while in a with block:
    seen, [(is_causal, the mask's shape or None, window, return_attn)]."""

    def __enter__(self):
        self.seen = []
        self.orig = qkv.torch._sdpa

        def watched(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_attn,
                    window=None):
            self.seen.append((bool(is_causal), None if attn_mask is None else tuple(attn_mask.shape),
                              window, bool(return_attn)))
            return self.orig(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_attn,
                             window)
        qkv.torch._sdpa = watched
        return self

    def __exit__(self, *exc):
        qkv.torch._sdpa = self.orig


class Counting(Watching):
    """How many calls (calls), and how many asked for the weights (with_attn)."""

    @property
    def calls(self):
        return len(self.seen)

    @property
    def with_attn(self):
        return sum(c[3] for c in self.seen)


class Spying(Watching):
    """calls: [(is_causal, the mask's shape or None, window)]."""

    @property
    def calls(self):
        return [c[:3] for c in self.seen]


class Forward(unittest.TestCase):

    def compare(self, make, dtype, tol):
        ids, mask = inputs()
        left = torch.ones(B, L, dtype=torch.long)
        left[0, :2] = 0     # padded at the start: not key lengths, a bias (GPT-2: with its causal mask)
        eager = make(dtype)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        with torch.no_grad():
            for m in (mask, None, left):
                with Counting() as c:
                    want = eager(input_ids=ids, attention_mask=m, output_attentions=True)
                    self.assertEqual(c.calls, 0)
                    got = ours(input_ids=ids, attention_mask=m, output_attentions=True)
                    self.assertEqual((c.calls, c.with_attn), (2, 2))    # each layer, via qkv
                self.assertEqual(got.last_hidden_state.dtype, dtype)
                self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), tol)
                self.assertEqual(len(got.attentions), len(want.attentions))
                for a, w in zip(got.attentions, want.attentions):
                    self.assertEqual(a.shape, w.shape)
                    self.assertEqual(a.shape, (B, 4, L, L))
                    self.assertLessEqual(maxdiff(a, w), tol)
                # without output_attentions: the same states, no weights
                got2 = ours(input_ids=ids, attention_mask=m)
                self.assertIsNone(got2.attentions)
                self.assertLessEqual(maxdiff(got2.last_hidden_state, want.last_hidden_state), tol)
            return ours(input_ids=ids, attention_mask=mask, output_attentions=True).attentions

    def test_bert(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
            att = self.compare(bert, dtype, tol)
            self.assertEqual(att[0][1, :, :, L - 3:].abs().max().item(), 0.0)  # padded keys: 0

    def test_bert_kin(self):
        for name in KIN:
            for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
                with self.subTest(model=name, dtype=dtype):
                    att = self.compare(bert_kin(name), dtype, tol)
                    self.assertEqual(att[0][1, :, :, L - 3:].abs().max().item(), 0.0)

    def test_distilbert(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
            att = self.compare(distilbert, dtype, tol)
            self.assertEqual(att[0][1, :, :, L - 3:].abs().max().item(), 0.0)

    def test_sdpa_models(self):
        # attn_implementation="sdpa": the models prepare other masks (4-D
        # additive ones, or none) when the weights are not asked for.
        # float32: GPT-2's sdpa mask fails in float64 in transformers itself.
        # transformers builds such models only on torch >= 2.1.1 (not on
        # Debian 12's 1.13, CI's): there no sdpa model can reach qkv.hf, and
        # the test checks that refusal instead.
        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if version < (2, 2):
            try:
                bert(torch.float32, impl="sdpa")
            except ImportError as e:
                self.assertIn("torch>=2.1.1", str(e))
                self.assertLess(version, (2, 2))
                return
        ids, mask = inputs()
        for make in (bert, bert_kin("Roberta"), distilbert, gpt2, seq2seq("Bart")) + \
                ((decoder("Llama"),) if INTERFACE else ()):
            eager = make(torch.float32)
            ours = qkv.hf.use_qkv(make(torch.float32, impl="sdpa"))
            with torch.no_grad():
                for m in (mask, None):
                    with self.subTest(model=make.__name__, mask=m is not None):
                        want = eager(input_ids=ids, attention_mask=m).last_hidden_state
                        with Counting() as c:
                            got = ours(input_ids=ids, attention_mask=m).last_hidden_state
                        # BART: 2 encoder layers, 2 decoder layers of 2 attentions
                        self.assertEqual(c.calls, 6 if make.__name__ == "Bart" else 2)
                        self.assertLessEqual(maxdiff(got, want), 1e-5)

    def test_vision(self):
        # no mask: every patch (token) sees every other
        for name in VISION:
            make, key, x = vision(name)
            for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
                with self.subTest(model=name, dtype=dtype), torch.no_grad():
                    eager = make(dtype)
                    ours = qkv.hf.use_qkv(copy.deepcopy(eager))
                    want = eager(**{key: x.to(dtype)}, output_attentions=True)
                    with Counting() as c:
                        got = ours(**{key: x.to(dtype)}, output_attentions=True)
                    self.assertEqual((c.calls, c.with_attn), (2, 2))
                    self.assertEqual(got.last_hidden_state.dtype, dtype)
                    self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), tol)
                    for a, w in zip(got.attentions, want.attentions):
                        self.assertEqual(a.shape, w.shape)
                        self.assertLessEqual(maxdiff(a, w), tol)
                    got2 = ours(**{key: x.to(dtype)})
                    self.assertIsNone(got2.attentions)
                    self.assertLessEqual(maxdiff(got2.last_hidden_state, want.last_hidden_state), tol)

    def test_gpt2(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
            att = self.compare(gpt2, dtype, tol)
            self.assertEqual(att[0].triu(1).abs().max().item(), 0.0)     # causal

    def test_gpt2_lm_head_and_cache(self):
        eager = gpt2(torch.float64, transformers.GPT2LMHeadModel)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        ids, mask = inputs()
        with torch.no_grad():
            want = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
            got = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
            self.assertLessEqual(maxdiff(got.logits, want.logits), 1e-10)
            # two steps with the cache: the first 4 tokens, then the other 3
            first = ours(input_ids=ids[:, :4], attention_mask=mask[:, :4], use_cache=True)
            second = ours(input_ids=ids[:, 4:], attention_mask=mask,
                          past_key_values=first.past_key_values, output_attentions=True)
            self.assertLessEqual(maxdiff(second.logits, want.logits[:, 4:]), 1e-10)
            for a, w in zip(second.attentions, want.attentions):
                self.assertEqual(a.shape, (B, 4, 3, L))
                self.assertLessEqual(maxdiff(a, w[:, :, 4:]), 1e-10)


def gradients(make):
    """[(name, eager's gradient, qkv's)] of a float64 model from make, padded
    batch, output_attentions=True: the input embeddings' first, then every
    parameter's that has one."""
    ids, mask = inputs()
    eager = make(torch.float64)
    ours = qkv.hf.use_qkv(copy.deepcopy(eager))
    grads = []
    for model in (eager, ours):
        emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        out = model(inputs_embeds=emb, attention_mask=mask, output_attentions=True)
        w = torch.linspace(-1, 1, out.last_hidden_state.numel(), dtype=torch.float64)
        (out.last_hidden_state.flatten() * w).sum().backward()
        grads.append(emb.grad)
    pairs = [("input embeddings", grads[0], grads[1])]
    for (n, a), (_, b) in zip(eager.named_parameters(), ours.named_parameters()):
        if a.grad is not None:
            pairs.append((n, a.grad, b.grad))
    return pairs


class Backward(unittest.TestCase):

    def check(self, make):
        pairs = gradients(make)
        self.assertGreater(pairs[0][1].abs().max().item(), 0.0)
        for n, a, b in pairs:
            self.assertLessEqual(maxdiff(b, a), 1e-5, n)

    def test_bert(self):
        self.check(bert)

    def test_bert_kin(self):
        for name in KIN:
            with self.subTest(model=name):
                self.check(bert_kin(name))

    def test_distilbert(self):
        self.check(distilbert)

    def test_vision(self):
        # the gradients of the input (pixels or spectrogram) and parameters
        for name in ("ViT", "Dinov2"):
            make, key, x = vision(name)
            eager = make(torch.float64)
            ours = qkv.hf.use_qkv(copy.deepcopy(eager))
            grads = []
            for model in (eager, ours):
                xi = x.clone().requires_grad_(True)
                out = model(**{key: xi}, output_attentions=True).last_hidden_state
                (out.flatten() * torch.linspace(-1, 1, out.numel(), dtype=torch.float64)).sum().backward()
                grads.append([xi.grad] + [p.grad for p in model.parameters() if p.grad is not None])
            self.assertGreater(grads[0][0].abs().max().item(), 0.0)
            self.assertEqual(len(grads[0]), len(grads[1]))
            for a, b in zip(*grads):
                self.assertLessEqual(maxdiff(b, a), 1e-10, name)


    def test_gpt2(self):
        self.check(gpt2)


# The vision (and audio) transformers whose self-attention is ViT's: name
# -> (extra config, the input's keyword, the input's shape without the batch)
VISION = {"ViT": ({}, "pixel_values", (3, 16, 16)),
          "DeiT": ({}, "pixel_values", (3, 16, 16)),
          "Dinov2": ({}, "pixel_values", (3, 16, 16)),
          "ViTMSN": ({}, "pixel_values", (3, 16, 16)),
          "Yolos": ({"image_size": [16, 16], "num_detection_tokens": 3}, "pixel_values", (3, 16, 16)),
          "AST": ({"num_mel_bins": 16, "max_length": 16, "frequency_stride": 4, "time_stride": 4},
                  "input_values", (16, 16)),
          "Vivit": ({"num_frames": 4, "tubelet_size": [2, 4, 4]}, "pixel_values", (4, 3, 16, 16))}


def vision(name):
    """(a maker like bert's, the model's input of a batch of B)."""
    extra, key, shape = VISION[name]

    def make(dtype, impl="eager"):
        torch.manual_seed(0)
        kw = {"image_size": 16, "num_channels": 3} if key == "pixel_values" else {}
        kw.update({"patch_size": 4} if name != "Vivit" else {})
        kw.update(extra)
        cfg = getattr(transformers, name + "Config")(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            attn_implementation=impl, **kw)
        return getattr(transformers, name + "Model")(cfg).to(dtype).eval()
    make.__name__ = name
    x = torch.randn((B,) + shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return make, key, x


# The encoder-decoders and decoders whose attention is BART's.
SEQ2SEQ = ("Bart", "MBart", "Pegasus", "Marian", "Blenderbot", "BlenderbotSmall", "PLBart")


def seq2seq(name, cls="Model"):
    def make(dtype, impl="eager"):
        torch.manual_seed(0)
        cfg = getattr(transformers, name + "Config")(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1,
            decoder_start_token_id=2, attn_implementation=impl)
        return getattr(transformers, name + cls)(cfg).to(dtype).eval()
    make.__name__ = name
    return make


def seq2seq_call():
    """The keyword arguments of an encoder-decoder's call on the padded
    batches, with output_attentions."""
    ids, mask = inputs()
    dids, dmask = decoder_inputs()
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=dids,
                decoder_attention_mask=dmask, output_attentions=True)


def t5(name, cls, **extra):
    def make(dtype):
        torch.manual_seed(0)
        cfg = getattr(transformers, name + "Config")(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
            decoder_start_token_id=0, pad_token_id=0, **extra)
        return getattr(transformers, name + cls)(cfg).to(dtype).eval()
    return make


def decoder_inputs():
    ids = torch.randint(3, VOCAB, (B, 5), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(B, 5, dtype=torch.long)
    mask[0, 3:] = 0
    return ids, mask


# The models whose attention is Llama's, through transformers' attention
# functions (4.48 on): name -> extra config. Mistral's window is narrower
# than the sequence, Qwen2 has biases in its projections, Granite scales its
# scores by its own multiplier.
DECODERS = {"Llama": {}, "Mistral": {"sliding_window": 4}, "Qwen2": {}, "Gemma": {},
            "Phi3": {"pad_token_id": 0}, "Granite": {"attention_multiplier": 0.3},
            "Starcoder2": {}}
INTERFACE = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 48)


def decoder(name, cls="Model"):
    def make(dtype, impl="eager"):
        torch.manual_seed(0)
        cfg = getattr(transformers, name + "Config")(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, vocab_size=VOCAB, attn_implementation=impl, **DECODERS[name])
        return getattr(transformers, name + cls)(cfg).to(dtype).eval()
    make.__name__ = name
    return make


def same_decoding(tc, want, got):
    """Two greedy decodings (tokens, last logits, [maps of a step]) alike:
    the same tokens, logits and maps within 1e-5; returns got."""
    tc.assertTrue(torch.equal(got[0], want[0]))
    tc.assertLessEqual(maxdiff(got[1], want[1]), 1e-5)
    for s, t in zip(got[2], want[2]):
        for a, w in zip(s, t):
            tc.assertEqual(a.shape, w.shape)
            tc.assertLessEqual(maxdiff(a, w), 1e-5)
    return got


def greedy_seq2seq(model, encode, start, mask=None, cache=None, steps=4):
    """Greedy decoding of an encoder-decoder step by step with its cache
    (cache(): the first step's, or None): (tokens, last logits, [cross and
    decoder maps of each step])."""
    kw = dict(use_cache=True, output_attentions=True)
    if mask is not None:
        kw["attention_mask"] = mask
    with torch.no_grad():
        kw["encoder_outputs"] = encode(model.get_encoder())
        t = torch.full((B, 1), start)
        out = model(decoder_input_ids=t, past_key_values=cache() if cache else None, **kw)
        tokens, maps = [], [out.cross_attentions]
        for _ in range(steps):
            t = out.logits[:, -1:].argmax(-1)
            tokens.append(t)
            out = model(decoder_input_ids=t, past_key_values=out.past_key_values, **kw)
            maps += [out.cross_attentions, out.decoder_attentions]
    return torch.cat(tokens, 1), out.logits, maps


def interface(test):
    """A test of Decoders; before transformers 4.48 (no attention functions
    to use) it checks that use_qkv refuses Llama instead."""
    def run(self):
        if INTERFACE:
            return test(self)
        with self.assertRaisesRegex(TypeError, "LlamaModel is not supported.*4.48 to 4.51"):
            qkv.hf.use_qkv(decoder("Llama")(torch.float32))
    run.__name__ = test.__name__
    return run


class Decoders(unittest.TestCase):
    """Llama and the models whose attention is Llama's, against their eager
    attention: outputs and weights, the masks (qkv's causal mask with key
    lengths where the model's mask is its causal mask with padding at the end;
    the mask itself where it is not), generation with the key/value cache,
    gradients, restore."""

    @interface
    def test_forward(self):
        ids, mask = inputs()
        left = torch.ones(B, L, dtype=torch.long)
        left[0, :2] = 0
        for name in DECODERS:
            for dtype in (torch.float32, torch.float64):
                eager = decoder(name)(dtype)
                ours = qkv.hf.use_qkv(copy.deepcopy(eager))
                # float64: eager's softmax is float32 (and its lowest float64
                # becomes -inf there, so a row with no key is NaN: no left
                # padding)
                # Mistral's window (4 keys) is in its mask: qkv's causal
                # window of 3 keys back
                window = 3 if name == "Mistral" else None
                masks = ((None, True), (mask, True), (left, False))
                for m, native in masks[:2] if dtype == torch.float64 else masks:
                    with self.subTest(model=name, dtype=dtype, mask=m), torch.no_grad():
                        want = eager(input_ids=ids, attention_mask=m, output_attentions=True)
                        with Spying() as c:
                            got = ours(input_ids=ids, attention_mask=m, output_attentions=True)
                        self.assertEqual(len(c.calls), 2)
                        want_call = (True, (B, 1, 1, L), window) if native else (False, (B, 1, L, L), None)
                        self.assertEqual(c.calls, [want_call] * 2)
                        self.assertEqual(got.last_hidden_state.dtype, dtype)
                        self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
                        for a, w in zip(got.attentions, want.attentions):
                            self.assertEqual(a.shape, (B, 4, L, L))
                            self.assertEqual(a.dtype, dtype)
                            self.assertLessEqual(maxdiff(a, w), 1e-5)
                        if m is mask:
                            self.assertEqual(got.attentions[0][1, :, :, L - 3:].abs().max().item(), 0.0)
                        with Counting() as c:       # no weights made when none are asked for
                            got2 = ours(input_ids=ids, attention_mask=m)
                        self.assertEqual((c.calls, c.with_attn), (2, 0))
                        self.assertIsNone(got2.attentions)
                        self.assertLessEqual(maxdiff(got2.last_hidden_state, want.last_hidden_state), 1e-5)

    @interface
    def test_bfloat16(self):
        # bfloat16 against the float32 model: qkv's output within 1.25 times
        # eager's distance from it (seen: 0.76-0.89 times; qkv's scores are
        # float32), the maps within 1e-2 of eager's
        ids, mask = inputs()
        ref = decoder("Llama")(torch.float32)
        eager = copy.deepcopy(ref).to(torch.bfloat16)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        with torch.no_grad():
            r = ref(input_ids=ids, attention_mask=mask).last_hidden_state
            want = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
            got = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
        self.assertEqual(got.last_hidden_state.dtype, torch.bfloat16)
        self.assertLessEqual(maxdiff(got.last_hidden_state.float(), r),
                             1.25 * maxdiff(want.last_hidden_state.float(), r))
        for a, w in zip(got.attentions, want.attentions):
            self.assertEqual(a.dtype, torch.bfloat16)
            self.assertLessEqual(maxdiff(a.float(), w.float()), 1e-2)

    @interface
    def test_generation_with_cache(self):
        # greedy decoding of a left-padded batch, step by step with the
        # model's cache: the prompt (a bias: left padding), then one token a
        # step (the query sees every cached key but the padding)
        ids, _ = inputs()
        left = torch.ones(B, L, dtype=torch.long)
        left[0, :2] = 0
        eager = decoder("Llama", "ForCausalLM")(torch.float32)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))

        def greedy(model, steps=4):
            m, tokens, atts = left, [], []
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=m, use_cache=True, output_attentions=True)
                for _ in range(steps):
                    atts.append(out.attentions)
                    t = out.logits[:, -1:].argmax(-1)
                    tokens.append(t)
                    m = torch.cat([m, torch.ones(B, 1, dtype=m.dtype)], 1)
                    out = model(input_ids=t, attention_mask=m, past_key_values=out.past_key_values,
                                use_cache=True, output_attentions=True)
            return torch.cat(tokens, 1), out.logits, atts + [out.attentions]
        got = same_decoding(self, greedy(eager), greedy(ours))
        self.assertEqual(got[2][-1][0].shape, (B, 4, 1, L + 4))

    @interface
    def test_backward(self):
        # float64, each gradient within 1e-6 of its largest element: eager's
        # softmax is float32 even here (seen: up to 1.2e-7; the gradients of
        # the input reach ~300)
        for name in ("Llama", "Qwen2"):
            with self.subTest(model=name):
                pairs = gradients(decoder(name))
                self.assertGreater(pairs[0][1].abs().max().item(), 0.0)
                for n, a, b in pairs:
                    self.assertLessEqual(maxdiff(b, a), 1e-6 * a.abs().max().item(), n)

    @interface
    def test_mask_kinds(self):
        # _causal_lengths: the model's causal mask (with a sliding window
        # where the model says it has one) with padding at the end becomes
        # (a padding mask, the window); anything else stays the mask
        low = torch.finfo(torch.float32).min
        n = 6
        pos = torch.arange(n)
        future = pos[None, :] > pos[:, None]
        m = torch.zeros(2, 1, n, n).masked_fill_(future, low)
        m[1, :, :, 4:] = low                            # padded after 4 keys
        pad = torch.zeros(2, 1, 1, n)
        pad[1, ..., 4:] = low
        found = qkv.hf._causal_lengths(m, n)
        self.assertTrue(torch.equal(found[0], pad))
        self.assertIsNone(found[1])
        self.assertIs(qkv.hf._causal_lengths(m, n), found)          # remembered
        self.assertEqual(qkv.hf._causal_lengths(m, n, 3)[1], None)  # no window in it
        m[0, 0, 2, 1] = low                             # changed in place: looked at again
        self.assertIsNone(qkv.hf._causal_lengths(m, n))
        m[0, 0, 2, 1] = 0.0
        self.assertIsNotNone(qkv.hf._causal_lengths(m.clone(), n))
        wider = torch.cat([m, torch.full((2, 1, n, 1), low)], 3)   # the mask is cut to the keys
        self.assertIsNotNone(qkv.hf._causal_lengths(wider, n))
        # a window of 3 keys (sliding_window 3: keys after i - 3)
        far = pos[None, :] <= pos[:, None] - 3
        win = m.masked_fill(far, low)
        self.assertIsNone(qkv.hf._causal_lengths(win, n))           # the model said none
        found = qkv.hf._causal_lengths(win, n, 3)
        self.assertTrue(torch.equal(found[0], pad))
        self.assertEqual(found[1], 2)
        self.assertIsNone(qkv.hf._causal_lengths(win, n, 2))        # another window
        win2 = win.clone()
        win2[1, :, :, 2:] = low              # padded after 2 keys: query 5 sees none
        self.assertIsNone(qkv.hf._causal_lengths(win2, n, 3))
        for bad in (m.transpose(2, 3).contiguous(),      # not causal
                    m.masked_fill(pos < 1, low),                       # padded at the start
                    m.masked_fill(pos == 2, low),                      # a hole
                    m.masked_fill(m == low, -1e4),                     # another value
                    torch.zeros(2, 1, n, n)):                          # no mask
            self.assertIsNone(qkv.hf._causal_lengths(bad, n))

    @interface
    def test_restore(self):
        for impl in ("eager", "sdpa"):
            try:
                model = decoder("Llama")(torch.float32, impl=impl)
            except ImportError:             # sdpa on torch < 2.1.1 (test_sdpa_models)
                continue
            self.assertIs(qkv.hf.use_qkv(qkv.hf.use_qkv(model)), model)
            self.assertEqual(model.config._attn_implementation, "qkv")
            self.assertIs(transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS["qkv"],
                          qkv.hf._interface_attention)
            self.assertIs(qkv.hf.restore(model), model)
            self.assertEqual(model.config._attn_implementation, impl)
            self.assertIs(qkv.hf.restore(model), model)
            self.assertEqual(model.config._attn_implementation, impl)
            ids, mask = inputs()
            with Spying() as c, torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
            self.assertEqual(c.calls, [])

    @interface
    def test_other_attention(self):
        # Gemma2 caps its scores, GPT-NeoX writes its own eager attention
        for name, kw in (("Gemma2", {}), ("GPTNeoX", {})):
            cfg = getattr(transformers, name + "Config")(
                hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                vocab_size=VOCAB, attn_implementation="eager", **kw)
            with self.assertRaisesRegex(TypeError, name + "Model is not supported"):
                qkv.hf.use_qkv(getattr(transformers, name + "Model")(cfg))


class Restore(unittest.TestCase):

    def test_restore(self):
        model = bert(torch.float64)
        eager_fwd = [type(m).forward for m in model.modules()
                     if isinstance(m, transformers.models.bert.modeling_bert.BertSelfAttention)]
        self.assertEqual(len(eager_fwd), 2)
        qkv.hf.use_qkv(model)
        ids, mask = inputs()
        # restore: each module's forward is its class's again, and the outputs follow
        self.assertIs(qkv.hf.restore(model), model)
        for m in model.modules():
            self.assertNotIn("forward", vars(m))
        ref = bert(torch.float64)
        with torch.no_grad():
            a = model(input_ids=ids, attention_mask=mask).last_hidden_state
            b = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        self.assertEqual(maxdiff(a, b), 0.0)
        qkv.hf.restore(model)    # twice: nothing to undo
        # use_qkv twice is the same as once
        qkv.hf.use_qkv(qkv.hf.use_qkv(model))
        qkv.hf.restore(model)
        for m in model.modules():
            self.assertNotIn("forward", vars(m))


class Seq2Seq(unittest.TestCase):
    """BART and the models whose attention is BART's: the encoder's
    self-attention, the decoder's causal self-attention with its cache, and
    cross-attention, against eager (float32: their eager masks overflow in
    float64 on torch 1.13)."""

    def test_forward(self):
        for name in SEQ2SEQ:
            with self.subTest(model=name), torch.no_grad():
                eager = seq2seq(name)(torch.float32)
                ours = qkv.hf.use_qkv(copy.deepcopy(eager))
                kw = seq2seq_call()
                want = eager(**kw)
                with Spying() as c:
                    got = ours(**kw)
                # encoder: the padding as key lengths; decoder: its causal
                # mask with its padding; cross: the encoder's padding
                enc, self_, cross = (False, (B, 1, 1, L), None), (True, (B, 1, 1, 5), None), \
                    (False, (B, 1, 1, L), None)
                self.assertEqual(c.calls, [enc, enc, self_, cross, self_, cross])
                self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
                self.assertLessEqual(maxdiff(got.encoder_last_hidden_state,
                                             want.encoder_last_hidden_state), 1e-5)
                for k in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
                    for a, w in zip(getattr(got, k), getattr(want, k)):
                        self.assertEqual(a.shape, w.shape)
                        self.assertLessEqual(maxdiff(a, w), 1e-5, k)
                self.assertEqual(got.cross_attentions[0][1, :, :, L - 3:].abs().max().item(), 0.0)
                # the decoder padded at its start: its mask, as it is
                left = torch.ones(B, 5, dtype=torch.long)
                left[1, :2] = 0
                kw["decoder_attention_mask"] = left
                want = eager(**kw)
                with Spying() as c:
                    got = ours(**kw)
                self.assertEqual(c.calls[2], (False, (B, 1, 5, 5), None))
                self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
                for a, w in zip(got.decoder_attentions, want.decoder_attentions):
                    self.assertLessEqual(maxdiff(a, w), 1e-5)

    def test_generation_with_cache(self):
        # greedy decoding step by step with the decoder's cache (its own keys
        # grow, the cross keys are reused)
        ids, mask = inputs()
        eager = seq2seq("Bart", "ForConditionalGeneration")(torch.float32)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))

        def greedy(model):
            return greedy_seq2seq(model, lambda e: e(input_ids=ids, attention_mask=mask), 2, mask)
        got = same_decoding(self, greedy(eager), greedy(ours))
        self.assertEqual(got[2][-1][0].shape, (B, 4, 1, 5))

    def test_whisper(self):
        # the encoder (no mask), the decoder's causal self-attention with its
        # padding, cross-attention (no mask); then greedy decoding with the
        # model's EncoderDecoderCache (the cross keys made once)
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
        torch.manual_seed(0)
        cfg = transformers.WhisperConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=15, max_target_positions=32,
            pad_token_id=1, decoder_start_token_id=2, attn_implementation="eager")
        eager = transformers.WhisperForConditionalGeneration(cfg).eval()
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        x = torch.randn(B, 16, 30, generator=torch.Generator().manual_seed(5))
        dids, dmask = decoder_inputs()
        with torch.no_grad():
            kw = dict(input_features=x, decoder_input_ids=dids, decoder_attention_mask=dmask,
                      output_attentions=True)
            want = eager(**kw)
            with Spying() as c:
                got = ours(**kw)
        enc, self_, cross = (False, None, None), (True, (B, 1, 1, 5), None), (False, None, None)
        self.assertEqual(c.calls, [enc, enc, self_, cross, self_, cross])
        self.assertLessEqual(maxdiff(got.logits, want.logits), 1e-5)
        for k in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
            for a, w in zip(getattr(got, k), getattr(want, k)):
                self.assertEqual(a.shape, w.shape)
                self.assertLessEqual(maxdiff(a, w), 1e-5, k)

        def greedy(model):
            return greedy_seq2seq(model, lambda e: e(x), 2,
                                  cache=lambda: EncoderDecoderCache(DynamicCache(), DynamicCache()))
        got = same_decoding(self, greedy(eager), greedy(ours))
        self.assertEqual(got[2][-1][0].shape, (B, 4, 1, 5))
        self.assertEqual(got[2][-2][0].shape, (B, 4, 1, 15))

    def test_t5(self):
        # unscaled scores plus the relative-position bias (with the mask in
        # it) as qkv's per-head bias; eager's softmax is float32 even in
        # float64, so 1e-5 for both
        ids, mask = inputs()
        for name in ("T5", "MT5"):
            for dtype in (torch.float32, torch.float64):
                with self.subTest(model=name, dtype=dtype), torch.no_grad():
                    eager = t5(name, "Model")(dtype)
                    ours = qkv.hf.use_qkv(copy.deepcopy(eager))
                    kw = seq2seq_call()
                    want = eager(**kw)
                    with Counting() as c:
                        got = ours(**kw)
                    self.assertEqual((c.calls, c.with_attn), (6, 6))
                    self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
                    for k in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
                        for a, w in zip(getattr(got, k), getattr(want, k)):
                            self.assertEqual(a.shape, w.shape)
                            self.assertLessEqual(maxdiff(a, w), 1e-5, k)
                    self.assertEqual(got.cross_attentions[0][1, :, :, L - 3:].abs().max().item(), 0.0)
        # greedy decoding with the model's cache (the bias of the new query's
        # row computed from cache_position)
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache
        eager = t5("T5", "ForConditionalGeneration")(torch.float32)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))

        def greedy(model):
            return greedy_seq2seq(model, lambda e: e(input_ids=ids, attention_mask=mask), 0, mask,
                                  cache=lambda: EncoderDecoderCache(DynamicCache(), DynamicCache()))
        got = same_decoding(self, greedy(eager), greedy(ours))
        self.assertEqual(got[2][-1][0].shape, (B, 4, 1, 5))

    def test_t5_backward(self):
        # in training mode (no dropout): the gradients reach the relative
        # position bias's table through qkv's bias gradient
        ids, mask = inputs()
        dids, dmask = decoder_inputs()
        eager = t5("T5", "Model", dropout_rate=0.0)(torch.float64).train()
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        grads = []
        for model in (eager, ours):
            out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dids,
                        decoder_attention_mask=dmask).last_hidden_state
            (out.flatten() * torch.linspace(-1, 1, out.numel(), dtype=torch.float64)).sum().backward()
            grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
        self.assertEqual(sorted(grads[0]), sorted(grads[1]))
        rel = [n for n in grads[0] if "relative_attention_bias" in n]
        self.assertEqual(len(rel), 2)                       # encoder's and decoder's
        for n in grads[0]:
            a, b = grads[0][n], grads[1][n]
            self.assertLessEqual(maxdiff(b, a), 1e-6 * max(1.0, a.abs().max().item()), n)
        self.assertGreater(grads[0][rel[0]].abs().max().item(), 0.0)

    def test_decoder_only_and_speech(self):
        ids, mask = inputs()
        torch.manual_seed(0)
        cfg = transformers.BioGptConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64,
                                        attn_implementation="eager")
        eager = transformers.BioGptModel(cfg).eval()
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        with torch.no_grad():
            want = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
            got = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
        self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
        for a, w in zip(got.attentions, want.attentions):
            self.assertLessEqual(maxdiff(a, w), 1e-5)
        torch.manual_seed(0)
        cfg = transformers.Speech2TextConfig(
            vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=64, input_feat_per_channel=16, num_conv_layers=1, conv_channels=8,
            conv_kernel_sizes=(5,), attn_implementation="eager")
        eager = transformers.Speech2TextModel(cfg).eval()
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        x = torch.randn(B, 20, 16, generator=torch.Generator().manual_seed(4))
        am = torch.ones(B, 20, dtype=torch.long)
        am[1, 12:] = 0
        dids, _ = decoder_inputs()
        with torch.no_grad():
            kw = dict(input_features=x, attention_mask=am, decoder_input_ids=dids, output_attentions=True)
            want, got = eager(**kw), ours(**kw)
        self.assertLessEqual(maxdiff(got.last_hidden_state, want.last_hidden_state), 1e-5)
        for a, w in zip(got.cross_attentions, want.cross_attentions):
            self.assertLessEqual(maxdiff(a, w), 1e-5)

    def test_backward(self):
        # float32 (see the class), each gradient within 1e-5 of its largest
        ids, mask = inputs()
        dids, dmask = decoder_inputs()
        eager = seq2seq("Bart")(torch.float32)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        grads = []
        for model in (eager, ours):
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            out = model(inputs_embeds=emb, attention_mask=mask, decoder_input_ids=dids,
                        decoder_attention_mask=dmask, output_attentions=True).last_hidden_state
            (out.flatten() * torch.linspace(-1, 1, out.numel())).sum().backward()
            grads.append([emb.grad] + [p.grad for p in model.parameters() if p.grad is not None])
        self.assertGreater(grads[0][0].abs().max().item(), 0.0)
        self.assertEqual(len(grads[0]), len(grads[1]))
        for a, b in zip(*grads):
            self.assertLessEqual(maxdiff(b, a), 1e-5 * max(1.0, a.abs().max().item()))

    def test_rows_alike(self):
        # a mask whose rows are alike becomes its first row (a tensor of its
        # own, remembered only while the mask lives); other masks stay
        import gc
        low = torch.finfo(torch.float32).min
        m = torch.zeros(2, 1, 1, 6)
        m[1, ..., 4:] = low
        full = m.expand(2, 1, 5, 6).clone()
        first = qkv.hf._rows_alike(full)
        self.assertTrue(torch.equal(first, m))
        self.assertIsNot(first._base, full)
        self.assertIs(qkv.hf._rows_alike(full), first)            # remembered
        full[0, 0, 3, 2] = low                                      # changed in place
        self.assertIs(qkv.hf._rows_alike(full), full)
        before = len(qkv.hf._seen_masks)
        del full
        gc.collect()
        self.assertEqual(len(qkv.hf._seen_masks), before - 1)       # forgotten with the mask
        self.assertIs(qkv.hf._rows_alike(m), m)                     # one row already

    def test_head_mask(self):
        ids, mask = inputs()
        dids, _ = decoder_inputs()
        model = qkv.hf.use_qkv(seq2seq("Bart")(torch.float32))
        with self.assertRaisesRegex(NotImplementedError, "head_mask"):
            model(input_ids=ids, attention_mask=mask, decoder_input_ids=dids, head_mask=torch.ones(2, 4))


def contrastive(name):
    def make(dtype, impl="eager"):
        torch.manual_seed(0)
        cfg = getattr(transformers, name + "Config")(
            text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, image_size=16, patch_size=4),
            attn_implementation=impl)
        return getattr(transformers, name + "Model")(cfg).to(dtype).eval()
    make.__name__ = name
    return make


class Contrastive(unittest.TestCase):
    """CLIP, CLIPSeg and SigLIP: the text encoder (CLIP's: its causal mask
    and padding mask) and the vision encoder (no mask), against eager, in
    float32 (CLIP's eager masks overflow in float64 on torch 1.13, and
    SigLIP's eager softmax is float32)."""

    def test_forward(self):
        ids, mask = inputs()
        px = torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(6))
        for name in ("CLIP", "CLIPSeg", "Siglip"):
            with self.subTest(model=name), torch.no_grad():
                eager = contrastive(name)(torch.float32)
                ours = qkv.hf.use_qkv(copy.deepcopy(eager))
                kw = dict(input_ids=ids, attention_mask=mask, pixel_values=px,
                          output_attentions=True)
                want = eager(**kw)
                with Spying() as c:
                    got = ours(**kw)
                # CLIP's text: qkv's causal mask with key lengths;
                # SigLIP's text: its padding as key lengths; vision: none
                text = (name != "Siglip", (B, 1, 1, L), None)
                self.assertEqual(sorted(c.calls, key=str),
                                 sorted([text] * 2 + [(False, None, None)] * 2, key=str))
                for part in ("text_model_output", "vision_model_output"):
                    a, w = getattr(got, part), getattr(want, part)
                    self.assertLessEqual(maxdiff(a.last_hidden_state, w.last_hidden_state), 1e-5, part)
                    for x, y in zip(a.attentions, w.attentions):
                        self.assertEqual(x.shape, y.shape)
                        self.assertLessEqual(maxdiff(x, y), 1e-5, part)
                self.assertLessEqual(maxdiff(got.logits_per_image, want.logits_per_image), 1e-5)

    def test_backward(self):
        ids, mask = inputs()
        px = torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(6))
        eager = contrastive("CLIP")(torch.float32)
        ours = qkv.hf.use_qkv(copy.deepcopy(eager))
        grads = []
        for model in (eager, ours):
            x = px.clone().requires_grad_(True)
            out = model(input_ids=ids, attention_mask=mask, pixel_values=x, output_attentions=True)
            out.logits_per_image.sum().backward()
            grads.append([x.grad] + [p.grad for p in model.parameters() if p.grad is not None])
        self.assertGreater(grads[0][0].abs().max().item(), 0.0)
        self.assertEqual(len(grads[0]), len(grads[1]))
        for a, b in zip(*grads):     # float32: within 1e-5 of each gradient's largest
            self.assertLessEqual(maxdiff(b, a), 1e-5 * max(1.0, a.abs().max().item()))


class Wrapped(unittest.TestCase):

    def test_module_holding_models(self):
        # a module of one's own holding transformers models (as a
        # SentenceTransformer holds its encoder): each inside is changed
        # (Llama's kin from transformers 4.48 on), and restored
        class Pooled(torch.nn.Module):
            def __init__(self, encoder, head):
                super().__init__()
                self.body = torch.nn.ModuleList([encoder])
                self.head = head

            def forward(self, ids, mask):
                h = self.body[0](input_ids=ids, attention_mask=mask).last_hidden_state
                return self.head(h.mean(1))

        def make():
            return Pooled(bert(torch.float64), torch.nn.Linear(32, 3).double())
        ids, mask = inputs()
        eager = make()
        ours = make()
        self.assertIs(qkv.hf.use_qkv(ours), ours)
        with torch.no_grad(), Counting() as c:
            want, got = eager(ids, mask), ours(ids, mask)
        self.assertEqual(c.calls, 2)
        self.assertLessEqual(maxdiff(got, want), 1e-10)
        both = torch.nn.ModuleDict({"enc": bert(torch.float32), "dec": decoder("Llama")(torch.float32)})

        def calls():
            with torch.no_grad(), Counting() as c:
                both["enc"](input_ids=ids, attention_mask=mask)
                both["dec"](input_ids=ids, attention_mask=mask)
            return c.calls
        qkv.hf.use_qkv(both)
        if INTERFACE:
            self.assertEqual(both["dec"].config._attn_implementation, "qkv")
            self.assertEqual(calls(), 4)
            qkv.hf.restore(both)
            self.assertEqual(both["dec"].config._attn_implementation, "eager")
            self.assertEqual(calls(), 0)
        else:
            # before 4.48 the Llama inside is not supported: it is left as it is
            self.assertEqual(calls(), 2)
        with self.assertRaisesRegex(TypeError, "Sequential is not supported.*or a module holding them"):
            qkv.hf.use_qkv(torch.nn.Sequential(torch.nn.Linear(2, 2)))


class Errors(unittest.TestCase):

    def test_other_model(self):
        with self.assertRaisesRegex(TypeError, "BERT .* GPT-2 .* Llama"):
            qkv.hf.use_qkv(torch.nn.Linear(3, 3))
        with self.assertRaisesRegex(TypeError, "transformers model"):
            qkv.hf.use_qkv("bert")
        other = transformers.OpenAIGPTModel(transformers.OpenAIGPTConfig(
            n_embd=32, n_layer=1, n_head=4, vocab_size=VOCAB))
        with self.assertRaisesRegex(TypeError, "OpenAIGPTModel is not supported"):
            qkv.hf.use_qkv(other)

    def test_head_mask(self):
        ids, mask = inputs()
        for make in (bert, gpt2):
            model = qkv.hf.use_qkv(make(torch.float32))
            with self.assertRaisesRegex(NotImplementedError, "head_mask"):
                model(input_ids=ids, attention_mask=mask, head_mask=torch.ones(4))
        make, key, x = vision("ViT")
        model = qkv.hf.use_qkv(make(torch.float32))
        with self.assertRaisesRegex(NotImplementedError, "head_mask"):
            model(**{key: x.float()}, head_mask=torch.ones(4))

    def test_cross_attention(self):
        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=64, vocab_size=VOCAB, is_decoder=True,
                                      add_cross_attention=True, attn_implementation="eager")
        model = qkv.hf.use_qkv(transformers.BertModel(cfg).eval())
        ids, mask = inputs()
        with self.assertRaisesRegex(NotImplementedError, "cross-attention"):
            model(input_ids=ids, encoder_hidden_states=torch.randn(B, 5, 32))

    def test_relative_positions(self):
        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=64, vocab_size=VOCAB,
                                      position_embedding_type="relative_key",
                                      attn_implementation="eager")
        with self.assertRaisesRegex(NotImplementedError, "relative_key"):
            qkv.hf.use_qkv(transformers.BertModel(cfg))


if __name__ == "__main__":
    print("qkv %s (%s), torch %s, transformers %s"
          % (qkv.version(), qkv.library_path, torch.__version__, transformers.__version__))
    unittest.main()
