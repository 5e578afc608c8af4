"""Hugging Face transformers' models with their attention computed by qkv:
BERT (and its kin), DistilBERT, GPT-2, ViT (and the vision and audio
models whose attention is ViT's), BART (and the encoder-decoders whose
attention is BART's: mBART, Pegasus, Marian, Blenderbot, PLBart,
Speech2Text, and the decoder BioGPT), Whisper, T5 (and mT5), CLIP (and
CLIPSeg), SigLIP, and Llama with the decoders whose attention is Llama's
(Mistral, Qwen2, Gemma, Phi-3, ...).

    import transformers, qkv.hf
    model = transformers.BertModel.from_pretrained("bert-base-uncased")
    qkv.hf.use_qkv(model)            # every self-attention layer now calls qkv
    out = model(**batch, output_attentions=True)   # out.attentions: qkv's weights
    qkv.hf.restore(model)            # back to the model's own attention

BERT, its kin, DistilBERT, GPT-2, ViT's kin: use_qkv replaces the forward
of each attention module of the model (BERT's BertSelfAttention, the same
module copied into RoBERTa, XLM-RoBERTa, CamemBERT and ELECTRA, DistilBERT's
MultiHeadSelfAttention, GPT-2's GPT2Attention, ViT's ViTSelfAttention, the
same module copied into DeiT, DINOv2, ViT-MSN, YOLOS, ViViT and the Audio
Spectrogram Transformer, BART's BartAttention and its copies, Whisper's
WhisperAttention, CLIP's CLIPAttention and CLIPSeg's copy, SigLIP's
SiglipAttention, T5's T5Attention and mT5's copy, and their sdpa
subclasses) by
a function that computes query, key and value with the module's own linear
layers and calls qkv.torch.scaled_dot_product_attention (return_attn=True
when output_attentions is asked for). Nothing else of the model changes:
its embeddings, masks, feed-forward layers and outputs are the model's.
restore removes the replacement.

Supported there: the forward signatures of transformers 4.x up to 4.49
(checked by use_qkv; tested with 4.46.3 and 4.49.0, the newest that runs on
torch 1.13), attn_implementation "eager" or "sdpa", the models'
padding masks (BERT's additive [B, 1, 1, S] mask, or any additive or
boolean mask broadcastable to [B, H, L, S]; GPT-2's causal mask plus its
padding mask; ViT's kin have none; BART's kin: the encoder's padding,
the decoder's causal mask with its padding, the cross-attention's padding,
each recognised as key lengths where it is one; Whisper's decoder mask
likewise; CLIP's text encoder: its causal mask becomes qkv's, its padding
mask key lengths; T5's: its relative-position bias with the mask in it, as
a per-head bias), GPT-2's, BART's, Whisper's and T5's key/value caches (layer_past, use_cache), float32,
float64, bfloat16 and float16, autograd, dropout in training mode (qkv's
dropout, not torch's; the returned weights are those before dropout).
Not supported (NotImplementedError): head_mask, cross-attention
(encoder_hidden_states), BERT's past_key_value, BERT's relative position
embeddings, a transformers version whose attention modules take other
arguments.

Llama and its kin (transformers 4.48 to 4.51): these models call their
attention through transformers' table of attention functions, by the name
in config._attn_implementation. use_qkv adds qkv's function to the table as
"qkv" and names it in the model's config (restore puts the model's own name
back). It is admitted for any model whose eager attention is Llama's
(eager_attention_forward of the model's module, the same text: Llama,
Mistral, Mixtral, Qwen2, Gemma, Phi, Phi-3, Granite, Starcoder2, OLMo,
OLMo-2, Cohere, GLM, ...; not Gemma-2, which caps its scores). It computes
what that function does: grouped-query heads (qkv's own GQA, no copies of
the keys), the module's scaling, the model's 4-D mask. The model's causal
mask with any padding at the end of the sequences (its mask when nothing is
padded) is recognised and becomes qkv's own causal mask with key lengths:
the tiles above the diagonal and past the padding are skipped. Other masks
(padding at the start, as batched generation pads; a sliding window;
queries after cached keys) are added as the model builds them. The
key/value cache, generate(), float32, float64, bfloat16, float16, autograd
and dropout in training mode as above.

A module that holds such models (a SentenceTransformer, say) may be passed
to use_qkv and restore: each supported transformers model inside it is
changed (the outermost ones), others are left as they are. A module with
none, and any other model, raises TypeError."""
import hashlib
import importlib
import inspect
import math
import sys
import weakref

import torch

from . import torch as _qt

__all__ = ["use_qkv", "restore"]

_ATTR = "_qkv_hf_patched"
_IMPL_ATTR = "_qkv_hf_attn_implementation"   # the model's own, while it runs through qkv
_IMPL = "qkv"                                 # its name among transformers' attention functions


# BERT and the encoders whose self-attention transformers copies from
# BERT's ("Copied from ...BertSelfAttention"): (module, class-name prefix).
_BERT_FAMILY = (("bert", "Bert"), ("roberta", "Roberta"), ("xlm_roberta", "XLMRoberta"),
                ("camembert", "Camembert"), ("electra", "Electra"))


# The vision (and audio) transformers whose self-attention transformers
# copies from ViT's ("Copied from ...ViTSelfAttention"): no mask.
_VIT_FAMILY = (("vit", "ViT"), ("deit", "DeiT"), ("dinov2", "Dinov2"), ("vit_msn", "ViTMSN"),
               ("yolos", "Yolos"), ("vivit", "Vivit"),
               ("audio_spectrogram_transformer", "AST"))


# The encoder-decoders and decoders whose attention transformers copies
# from BART's ("Copied from ...BartAttention"): (module, class-name prefix).
_BART_FAMILY = (("bart", "Bart"), ("mbart", "MBart"), ("pegasus", "Pegasus"), ("marian", "Marian"),
                ("blenderbot", "Blenderbot"), ("blenderbot_small", "BlenderbotSmall"),
                ("plbart", "PLBart"), ("biogpt", "BioGpt"), ("speech_to_text", "Speech2Text"))


# CLIP and the models whose attention transformers copies from CLIP's
# (text: a causal mask and a padding mask; vision: none); SigLIP's is
# written alike with one mask.
_CLIP_FAMILY = (("clip", "CLIP"), ("clipseg", "CLIPSeg"))


def _classes():
    """[(PreTrainedModel base, self-attention class, forward)] of the
    supported models that this transformers has."""
    try:
        from transformers.models.gpt2 import modeling_gpt2 as mg
        from transformers.models.distilbert import modeling_distilbert as md
    except ImportError as e:
        raise ImportError("qkv.hf needs transformers (pip install transformers): %s" % e) from None
    found = []
    for family, suffix, forward in ((_BERT_FAMILY, "SelfAttention", _bert_forward),
                                    (_VIT_FAMILY, "SelfAttention", _vit_forward),
                                    (_BART_FAMILY, "Attention", _bart_forward),
                                    ((("whisper", "Whisper"),), "Attention", _whisper_forward),
                                    (_CLIP_FAMILY, "Attention", _clip_forward),
                                    ((("siglip", "Siglip"),), "Attention", _siglip_forward),
                                    ((("t5", "T5"), ("mt5", "MT5")), "Attention", _t5_forward)):
        for mod, prefix in family:
            try:
                m = importlib.import_module("transformers.models.%s.modeling_%s" % (mod, mod))
            except ImportError:
                continue
            base = getattr(m, prefix + "PreTrainedModel", None)
            att = getattr(m, prefix + suffix, None)
            if base is not None and att is not None:
                found.append((base, att, forward))
    found.append((md.DistilBertPreTrainedModel, md.MultiHeadSelfAttention, _distilbert_forward))
    found.append((mg.GPT2PreTrainedModel, mg.GPT2Attention, _gpt2_forward))
    return found


def _check_args(name, head_mask, encoder_hidden_states, kwargs):
    extra = sorted(k for k, v in kwargs.items() if v is not None)
    if extra:
        raise NotImplementedError("qkv.hf: %s: argument(s) %s not supported through qkv"
                                  % (name, ", ".join(extra)))
    if head_mask is not None:
        raise NotImplementedError("qkv.hf: %s: head_mask is not supported through qkv "
                                  "(call qkv.hf.restore(model) to use it)" % name)
    if encoder_hidden_states is not None:
        raise NotImplementedError("qkv.hf: %s: cross-attention (encoder_hidden_states) is not "
                                  "supported through qkv (call qkv.hf.restore(model))" % name)


def _float_mask(mask, dtype):
    """The model's mask as an additive mask in dtype (a boolean one: True
    attends)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask if mask.dtype == dtype else mask.to(dtype)


def _padding(mask, S):
    """Whether an additive mask [B, 1, 1, S] pads each sequence at its end
    (qkv.torch's key lengths)."""
    return (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1 and mask.shape[3] == S and
            _qt._padding_lengths(mask[:, 0, 0, :], mask.dtype, S) is not None)


def _heads(x, H, D):
    """[B, L, H * D] as [B, H, L, D] (a view)."""
    return x.view(x.shape[0], x.shape[1], H, D).permute(0, 2, 1, 3)


def _attend(q, k, v, mask, dropout_p, is_causal, scale, output_attentions):
    """qkv's attention of q [B, H, L, D], k, v: (out [B, L, H * D], weights or None)."""
    res = _qt._sdpa(q, k, v, mask, dropout_p, is_causal, scale, False, bool(output_attentions))
    out, attn = res if output_attentions else (res, None)
    B, H, L, D = out.shape
    return out.permute(0, 2, 1, 3).reshape(B, L, H * D), attn


def _bert_forward(self, hidden_states, attention_mask=None, head_mask=None,
                  encoder_hidden_states=None, encoder_attention_mask=None,
                  past_key_value=None, output_attentions=False, **kwargs):
    _check_args(type(self).__name__, head_mask, encoder_hidden_states, kwargs)
    if past_key_value is not None:
        raise NotImplementedError("qkv.hf: %s: past_key_value is not supported through qkv "
                                  "(call qkv.hf.restore(model))" % type(self).__name__)
    H, D = self.num_attention_heads, self.attention_head_size
    q, k, v = (_heads(f(hidden_states), H, D) for f in (self.query, self.key, self.value))
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    p = self.dropout.p if self.training else 0.0
    ctx, attn = _attend(q, k, v, mask, p, False, 1.0 / math.sqrt(D), output_attentions)
    outputs = (ctx, attn) if output_attentions else (ctx,)
    if self.is_decoder:
        outputs = outputs + ((k, v),)
    return outputs


def _vit_forward(self, hidden_states, head_mask=None, output_attentions=False):
    """ViT's ViTSelfAttention (and the modules copied from it, and their sdpa
    subclasses): every patch attends to every patch, no mask."""
    _check_args(type(self).__name__, head_mask, None, {})
    H, D = self.num_attention_heads, self.attention_head_size
    q, k, v = (_heads(f(hidden_states), H, D) for f in (self.query, self.key, self.value))
    p = self.dropout.p if self.training else 0.0
    ctx, attn = _attend(q, k, v, None, p, False, 1.0 / math.sqrt(D), output_attentions)
    return (ctx, attn) if output_attentions else (ctx,)


def _bart_forward(self, hidden_states, key_value_states=None, past_key_value=None,
                  attention_mask=None, layer_head_mask=None, output_attentions=False):
    """BART's BartAttention (and the modules copied from it, and their sdpa
    subclasses): self-attention, the decoder's causal self-attention with
    its cache (a tuple (key, value) [B, H, S, D]), and cross-attention
    (key_value_states, the cross cache reused when its length fits)."""
    _check_args(type(self).__name__, layer_head_mask, None, {})
    is_cross = key_value_states is not None
    H, D = self.num_heads, self.head_dim
    q = _heads(self.q_proj(hidden_states), H, D)
    if is_cross and past_key_value is not None and past_key_value[0].shape[2] == key_value_states.shape[1]:
        k, v = past_key_value[0], past_key_value[1]
    else:
        src = key_value_states if is_cross else hidden_states
        k, v = _heads(self.k_proj(src), H, D), _heads(self.v_proj(src), H, D)
        if past_key_value is not None and not is_cross:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
    present = (k, v) if self.is_decoder else None
    out, attn = _encdec_attend(self, q, k, v, attention_mask, is_cross, output_attentions)
    return self.out_proj(out), attn, present


def _whisper_forward(self, hidden_states, key_value_states=None, past_key_value=None,
                     attention_mask=None, layer_head_mask=None, output_attentions=False,
                     cache_position=None):
    """Whisper's WhisperAttention (and its sdpa subclass): as BART's, with
    the model's EncoderDecoderCache (the self-attention's keys appended at
    cache_position, the cross-attention's computed once and reused)."""
    _check_args(type(self).__name__, layer_head_mask, None, {})
    is_cross = key_value_states is not None
    H, D = self.num_heads, self.head_dim
    q = _heads(self.q_proj(hidden_states), H, D)
    is_updated = False
    if past_key_value is not None:
        is_updated = past_key_value.is_updated.get(self.layer_idx)
        if is_cross:
            past_key_value.is_updated[self.layer_idx] = True
            past_key_value = past_key_value.cross_attention_cache
        else:
            past_key_value = past_key_value.self_attention_cache
    if is_cross and past_key_value and is_updated:
        k, v = past_key_value.key_cache[self.layer_idx], past_key_value.value_cache[self.layer_idx]
    else:
        src = key_value_states if is_cross else hidden_states
        k, v = _heads(self.k_proj(src), H, D), _heads(self.v_proj(src), H, D)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx,
                                         {"cache_position": None if is_cross else cache_position})
    out, attn = _encdec_attend(self, q, k, v, attention_mask, is_cross, output_attentions)
    return self.out_proj(out), attn, past_key_value


def _encdec_attend(self, q, k, v, attention_mask, is_cross, output_attentions):
    """The attention of BART's and Whisper's modules: the model's additive
    mask [B, 1, L, >= S] (cut to the keys): its causal mask with end padding
    becomes qkv's causal mask with key lengths, one whose rows are all alike
    (a padding mask) key lengths; None with a causal module (is_causal: an
    sdpa model's decoder, L > 1) is qkv's causal mask (torch's alignment);
    scaled by the module's scaling. (out [B, L, H * D], weights or None)."""
    L, S = q.shape[2], k.shape[2]
    mask, causal = attention_mask, False
    if mask is not None:
        if mask.dim() != 4 or mask.shape[0] != q.shape[0] or mask.shape[1] != 1 or \
                mask.shape[2] != L or mask.shape[3] < S:
            raise ValueError("qkv.hf: %s: attention mask of shape %s, expected %s"
                             % (type(self).__name__, tuple(mask.shape), (q.shape[0], 1, L, S)))
        mask = _float_mask(mask, q.dtype)
        found = _causal_lengths(mask, S) if L == S and L > 1 and not is_cross else None
        if found is not None:
            mask, causal = found[0], True
        else:
            mask = _rows_alike(mask if mask.shape[3] == S else mask[:, :, :, :S])
    elif getattr(self, "is_causal", False) and not is_cross and L > 1:
        causal = True
    p = self.dropout if self.training else 0.0
    return _attend(q, k, v, mask, p, causal, self.scaling, output_attentions)


def _clip_forward(self, hidden_states, attention_mask=None, causal_attention_mask=None,
                  output_attentions=False):
    """CLIP's CLIPAttention (and the modules copied from it, and their sdpa
    subclasses): the text encoder's causal mask (qkv's own where it is the
    causal mask) and padding mask (key lengths where its rows are alike),
    added as the model does; the vision encoder has none."""
    return _clip_attend(self, hidden_states, attention_mask, causal_attention_mask, output_attentions)


def _siglip_forward(self, hidden_states, attention_mask=None, output_attentions=False):
    """SigLIP's SiglipAttention (and its sdpa subclass): as CLIP's, one mask."""
    return _clip_attend(self, hidden_states, attention_mask, None, output_attentions)


def _clip_attend(self, hidden_states, attention_mask, causal_attention_mask, output_attentions):
    H, D = self.num_heads, self.head_dim
    q, k, v = (_heads(f(hidden_states), H, D) for f in (self.q_proj, self.k_proj, self.v_proj))
    B, L = q.shape[0], q.shape[2]
    masks = []
    for m in (causal_attention_mask, attention_mask):
        if m is not None:
            if m.shape != (B, 1, L, L):
                raise ValueError("qkv.hf: %s: attention mask of shape %s, expected %s"
                                 % (type(self).__name__, tuple(m.shape), (B, 1, L, L)))
            masks.append(_float_mask(m, q.dtype))
    causal = False
    if causal_attention_mask is not None and L > 1:
        found = _causal_lengths(masks[0], L)
        if found is not None:
            causal, masks[0] = True, found[0]       # its padding, if any: [B, 1, 1, L]
    if masks and (causal or len(masks) == 1):
        masks = [_rows_alike(m) for m in masks]
    bias = None
    for m in masks:                                 # added in the model's order
        bias = m if bias is None else bias + m
    p = self.dropout if self.training else 0.0
    out, attn = _attend(q, k, v, bias, p, causal, self.scale, output_attentions)
    return self.out_proj(out), attn


def _t5_forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None,
                past_key_value=None, layer_head_mask=None, query_length=None, use_cache=False,
                output_attentions=False, cache_position=None):
    """T5's T5Attention (and MT5's copy): unscaled scores plus the position
    bias (the relative-position buckets of the model's first layer, with
    the mask added in, computed here as the model does when none is handed
    in, and handed on), self-, causal and cross-attention with the model's
    EncoderDecoderCache. The bias is qkv's per-head additive bias; its
    gradient reaches the model's relative_attention_bias in training."""
    name = type(self).__name__
    _check_args(name, layer_head_mask, None, {})
    if self.pruned_heads:
        raise NotImplementedError("qkv.hf: %s: pruned heads are not supported through qkv "
                                  "(call qkv.hf.restore(model))" % name)
    is_cross = key_value_states is not None
    H, D = self.n_heads, self.key_value_proj_dim
    q = _heads(self.q(hidden_states), H, D)
    L = q.shape[2]
    is_updated, cache = False, None
    if past_key_value is not None:
        is_updated = past_key_value.is_updated.get(self.layer_idx)
        cache = past_key_value.cross_attention_cache if is_cross else past_key_value.self_attention_cache
    if is_cross and past_key_value is not None and is_updated:
        k, v = cache.key_cache[self.layer_idx], cache.value_cache[self.layer_idx]
    else:
        src = key_value_states if is_cross else hidden_states
        k, v = _heads(self.k(src), H, D), _heads(self.v(src), H, D)
        if past_key_value is not None:
            k, v = cache.update(k, v, self.layer_idx,
                                {"cache_position": None if is_cross else cache_position})
            if is_cross:
                past_key_value.is_updated[self.layer_idx] = True
    if position_bias is None:
        S = k.shape[2]
        if not self.has_relative_attention_bias:
            position_bias = torch.zeros((1, H, L, S), dtype=q.dtype)
            if self.gradient_checkpointing and self.training:
                position_bias.requires_grad = True
        else:
            real = query_length if query_length is not None else cache_position[-1] + 1
            position_bias = self.compute_bias(real, S, device=q.device, cache_position=cache_position)
            position_bias = position_bias[:, :, -L:, :]
        if mask is not None:
            position_bias = position_bias + mask[:, :, :, :S]
    p = self.dropout if self.training else 0.0
    out, attn = _attend(q, k, v, position_bias, p, False, 1.0, output_attentions)
    outputs = (self.o(out), past_key_value, position_bias)
    return outputs + (attn,) if output_attentions else outputs


def _distilbert_forward(self, query, key, value, mask, head_mask=None, output_attentions=False,
                        **kwargs):
    """DistilBERT's MultiHeadSelfAttention (and its sdpa subclass). Its mask
    is the model's [B, S] (0: padding), which the eager path fills into the
    scores as the dtype's lowest value, or the sdpa path's additive
    [B, 1, L, S]; either becomes an additive mask."""
    name = type(self).__name__
    _check_args(name, head_mask, None, kwargs)
    if key is not query or value is not query:
        raise NotImplementedError("qkv.hf: %s: attention between different inputs is not "
                                  "supported through qkv (call qkv.hf.restore(model))" % name)
    H = self.n_heads
    D = self.dim // H
    q, k, v = (_heads(f(query), H, D) for f in (self.q_lin, self.k_lin, self.v_lin))
    B, S = query.shape[0], query.shape[1]
    if mask is not None and mask.dim() == 2:
        mask = torch.zeros(B, 1, 1, S, dtype=q.dtype).masked_fill_(
            (mask == 0).view(B, 1, 1, S), torch.finfo(q.dtype).min)
    mask = _float_mask(mask, q.dtype)
    p = self.dropout.p if self.training else 0.0
    ctx, attn = _attend(q, k, v, mask, p, False, 1.0 / math.sqrt(D), output_attentions)
    ctx = self.out_lin(ctx)
    return (ctx, attn) if output_attentions else (ctx,)


def _gpt2_forward(self, hidden_states, layer_past=None, attention_mask=None, head_mask=None,
                  encoder_hidden_states=None, encoder_attention_mask=None, use_cache=False,
                  output_attentions=False, **kwargs):
    _check_args("GPT2Attention", head_mask, encoder_hidden_states, kwargs)
    if self.is_cross_attention:
        raise NotImplementedError("qkv.hf: GPT2Attention: cross-attention is not supported "
                                  "through qkv (call qkv.hf.restore(model))")
    H, D = self.num_heads, self.head_dim
    q, k, v = (_heads(x, H, D) for x in self.c_attn(hidden_states).split(self.split_size, dim=2))
    if layer_past is not None:
        k = torch.cat((layer_past[0], k), dim=-2)
        v = torch.cat((layer_past[1], v), dim=-2)
    present = (k, v) if use_cache is True else None
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(D) if self.scale_attn_weights else 1.0
    if self.scale_attn_by_inverse_layer_idx:
        scale /= float(self.layer_idx + 1)
    mask = _float_mask(attention_mask, q.dtype)
    if L == S and (mask is None or _padding(mask, S)):
        # The causal mask is qkv's own and a padding mask at the end becomes
        # key lengths (qkv.torch): the tiles above the diagonal are skipped,
        # and every query keeps a key, so the weights are the model's.
        causal, bias = True, mask
    else:
        # query i is at position i + S - L: it sees keys j <= i + S - L (the
        # model's own causal mask, masked with the dtype's lowest value).
        keep = torch.ones(L, S, dtype=torch.bool).tril(S - L)
        bias = torch.zeros(L, S, dtype=q.dtype).masked_fill_(~keep, torch.finfo(q.dtype).min)
        if mask is not None:
            bias = bias + mask
        causal = False
    p = self.attn_dropout.p if self.training else 0.0
    out, attn = _attend(q, k, v, bias, p, causal, scale, output_attentions)
    out = self.resid_dropout(self.c_proj(out))
    outputs = (out, present)
    if output_attentions:
        outputs += (attn,)
    return outputs


# The decoders of transformers 4.48 on (Llama, Mistral, Qwen2, Gemma, Phi-3,
# ... and every model whose attention is written like Llama's) call their
# attention through transformers' table of attention functions, by the name
# in config._attn_implementation. Their eager one is eager_attention_forward
# of the model's module: use_qkv admits a model whose eager_attention_forward
# is this text (its source's SHA-256, the same in 4.48.0 to 4.51.3), which is
# the arithmetic _interface_attention reproduces: key and value heads shared
# by groups of query heads (repeat_kv), the scores scaled, the model's 4-D
# additive mask (cut to the keys) added, softmax in float32, dropout, the
# weights times value, [B, L, H, D] out.
_LLAMA_EAGER_SHA256 = "ad54bea90e61fbdb79597b5b3d964183317ca4d125b0f572d496a5b2458c7eac"
_INTERFACE_VERSIONS = ((4, 48), (4, 51))     # the transformers whose interface this is


def _eager_digest(module):
    f = getattr(module, "eager_attention_forward", None)
    if f is None:
        return None
    try:
        return hashlib.sha256(inspect.getsource(f).encode()).hexdigest()
    except (OSError, TypeError):
        return None


def _interface_model(model):
    """Whether the model's attention goes through transformers' attention
    functions with Llama's eager arithmetic (see _LLAMA_EAGER_SHA256)."""
    mod = sys.modules.get(type(model).__module__)
    if mod is None or not hasattr(mod, "ALL_ATTENTION_FUNCTIONS"):
        return False
    return _eager_digest(mod) == _LLAMA_EAGER_SHA256


# What was found about the models' masks (_causal_lengths, _rows_alike):
# {(id of the mask, question): (weak reference, version counter, answer)}.
# A model hands the same mask to every layer; a few are kept (a decoder
# layer has its causal mask and the encoder's), each only while its mask
# lives, and no answer holds on to a mask's memory (answers are [B, 1, 1,
# S] tensors of their own).
_seen_masks = {}


def _remembered(mask, question, find):
    """find(), remembered for this mask (while it lives, unchanged)."""
    key = (id(mask), question)
    seen = _seen_masks.get(key)
    if seen is not None and seen[0]() is mask and seen[1] == mask._version:
        return seen[2]
    answer = find()
    if len(_seen_masks) >= 8:
        _seen_masks.clear()
    try:
        ref = weakref.ref(mask, lambda r, key=key: _seen_masks.pop(key, None))
    except TypeError:
        return answer
    _seen_masks[key] = (ref, mask._version, answer)
    return answer


def _causal_lengths(attention_mask, S, sliding_window=None):
    """Whether the model's mask [B, 1, L, >= S] (cut to S keys, L == S) is
    its causal mask with each sequence padded at its end, and with a sliding
    window (query i sees keys after i - sliding_window) where the model has
    one: then (a padding mask [B, 1, 1, S], window) computes the same with
    qkv's own causal mask (window None) or causal window (keys i - window ..
    i) and key lengths; else None (the mask stays a bias). Every query must
    keep a key (where none is left, eager's weights are uniform)."""
    def find():
        mask = attention_mask[:, :, :, :S]
        if not (mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == S and
                mask.dtype.is_floating_point):
            return None
        low = torch.finfo(mask.dtype).min
        pos = torch.arange(S)
        lens = (mask[:, 0] == 0).any(1).sum(-1)         # keys seen by some query
        padded = pos[None, None, :] >= lens[:, None, None]
        windows = [None]
        if isinstance(sliding_window, int) and 0 < sliding_window < S:
            windows.append(sliding_window - 1)
        for window in windows:
            hide = (pos[None, :] > pos[:, None])[None] | padded
            if window is not None:
                hide = hide | (pos[None, :] < pos[:, None] - window)[None]
            if bool((~hide).any(-1).all()) and torch.equal(
                    mask[:, 0], torch.zeros(hide.shape, dtype=mask.dtype).masked_fill_(hide, low)):
                pad = torch.zeros(mask.shape[0], 1, 1, S, dtype=mask.dtype)
                return pad.masked_fill_(padded[:, None], low), window
        return None
    return _remembered(attention_mask, ("causal", S, sliding_window), find)


def _rows_alike(mask):
    """A mask [B, Hm, L, S] whose rows are all the same (a padding mask
    expanded over the queries, as the encoders and cross-attention get it)
    as [B, Hm, 1, S], which qkv.torch can take as key lengths; else the
    mask."""
    def find():
        first = mask[:, :, :1, :]
        return first.clone() if torch.equal(mask, first.expand(mask.shape)) else None
    if mask.dim() != 4 or mask.shape[2] == 1:
        return mask
    found = _remembered(mask, "rows", find)
    return mask if found is None else found


def _interface_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         **kwargs):
    """transformers' attention function "qkv" (see use_qkv): query [B, H, L,
    D], key and value [B, H_kv, S, D] (H a multiple of H_kv), the model's
    additive mask [B, 1, L, >= S] or None; returns (output [B, L, H, D],
    the weights [B, H, L, S] when output_attentions is asked for, else None).
    Like eager_attention_forward, it applies the mask it is given (None: no
    mask) and no other; other arguments (is_causal, ...) are for other
    implementations, whose masks differ, and are not used, but for
    sliding_window, the window a mask is checked for (_causal_lengths)."""
    L, S = query.shape[-2], key.shape[-2]
    mask, causal, window = attention_mask, False, None
    if mask is not None:
        if L == S and L > 1 and mask.dtype == query.dtype:
            found = _causal_lengths(mask, S, kwargs.get("sliding_window"))
            if found is not None:
                (mask, window), causal = found, True
        if not causal:
            mask = _float_mask(mask[:, :, :, :S], query.dtype)
    # transformers 4.48 to 4.51 say whether the weights are wanted; where
    # it is not said, they are returned, as eager does.
    want = bool(kwargs.get("output_attentions", True))
    p = float(dropout) if module.training else 0.0
    res = _qt._sdpa(query, key, value, mask, p, causal, scaling, query.shape[1] != key.shape[1], want,
                    window)
    out, attn = res if want else (res, None)
    return out.transpose(1, 2), attn


def _named_parameters(f):
    return [n for n, p in inspect.signature(f).parameters.items() if p.kind != p.VAR_KEYWORD]


def _expect_signature(cls, forward):
    """The module's forward must take the named arguments ours does (a
    trailing **kwargs, as 4.48 on have, is allowed)."""
    want, have = _named_parameters(forward), _named_parameters(cls.forward)
    if have != want:
        import transformers
        raise NotImplementedError(
            "qkv.hf: %s.forward of transformers %s takes (%s), not the (%s) qkv.hf implements "
            "(transformers 4.x up to 4.49, tested with 4.46.3 and 4.49.0)"
            % (cls.__name__, transformers.__version__, ", ".join(have[1:]), ", ".join(want[1:])))


_INTERFACE = "interface"


def _kind(model):
    """(attention class, forward) of a model whose attention modules qkv.hf
    replaces; _INTERFACE for a model that calls transformers' attention
    functions with Llama's eager arithmetic (_interface_model); None for any
    other module."""
    for base, cls, forward in _classes():
        if isinstance(model, base):
            return cls, forward
    if _interface_model(model):
        return _INTERFACE
    return None


def _targets(model):
    """[(a transformers model, its _kind)]: the model itself, or else the
    outermost supported transformers models inside it (a
    SentenceTransformer's, say)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("qkv.hf: expected a transformers model, not %s" % type(model).__name__)
    kind = _kind(model)
    if kind is not None:
        return [(model, kind)]
    found, inside = [], []
    for name, m in model.named_modules():
        if name and not any(name.startswith(p + ".") for p in inside):
            kind = _kind(m)
            if kind is not None:
                found.append((m, kind))
                inside.append(name)
    if not found:
        raise TypeError("qkv.hf: %s is not supported: BERT (BertModel, BertFor*), the encoders "
                        "whose attention is BERT's (RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA), "
                        "DistilBERT, GPT-2 (GPT2Model, GPT2LMHeadModel, ...), ViT and the models "
                        "whose attention is ViT's (DeiT, DINOv2, ViT-MSN, YOLOS, ViViT, AST), BART "
                        "and the models whose attention is BART's (mBART, Pegasus, Marian, "
                        "Blenderbot, PLBart, BioGPT, Speech2Text), Whisper, T5, mT5, CLIP, CLIPSeg, "
                        "SigLIP and, "
                        "with transformers 4.48 to 4.51, the models whose attention is Llama's "
                        "(Llama, Mistral, Qwen2, Gemma, Phi-3, ...) are, or a module holding them"
                        % type(model).__name__)
    return found


def _interface_impl(model):
    """The attention implementation a model of _INTERFACE kind names of its
    own (kept while it runs through qkv, for restore), checked."""
    import transformers
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    lo, hi = _INTERFACE_VERSIONS
    if not lo <= version <= hi:
        raise NotImplementedError(
            "qkv.hf: %s with transformers %s: qkv.hf implements the attention functions of "
            "transformers %d.%d to %d.%d" % (type(model).__name__, transformers.__version__,
                                             lo[0], lo[1], hi[0], hi[1]))
    impl = getattr(model, _IMPL_ATTR, None) or getattr(model.config, "_attn_implementation", "eager") or "eager"
    if impl not in ("eager", "sdpa", _IMPL):
        raise NotImplementedError("qkv.hf: attn_implementation %r is not supported (eager or "
                                  "sdpa: load the model with attn_implementation=\"eager\")" % impl)
    return impl


def _use_interface(model, impl):
    """The model's attention function becomes qkv's: transformers' table of
    attention functions gets the entry "qkv" (_interface_attention), and the
    model's config names it."""
    from transformers import modeling_utils
    modeling_utils.ALL_ATTENTION_FUNCTIONS[_IMPL] = _interface_attention
    setattr(model, _IMPL_ATTR, impl)
    model.config._attn_implementation = _IMPL


def use_qkv(model):
    """Makes the self-attention layers of a transformers model run through
    qkv (in place); returns the model. A module that is not one itself but
    holds some (a SentenceTransformer, a model of one's own around a
    transformers encoder) has each supported one changed. See the module's
    documentation for the models and what is supported."""
    targets = _targets(model)
    plans = []    # (model, its attention modules and their forward, or None and its own impl)
    for m, kind in targets:       # every check before any change
        if kind is _INTERFACE:
            plans.append((m, None, _interface_impl(m)))
            continue
        cls, forward = kind
        impl = getattr(m.config, "_attn_implementation", "eager") or "eager"
        if impl not in ("eager", "sdpa"):
            raise NotImplementedError("qkv.hf: attn_implementation %r is not supported (eager or "
                                      "sdpa: load the model with attn_implementation=\"eager\")" % impl)
        mods = [a for a in m.modules() if isinstance(a, cls)]
        if not mods:
            raise TypeError("qkv.hf: %s has no %s module" % (type(m).__name__, cls.__name__))
        for a in mods:
            _expect_signature(type(a), forward)
        if forward is _bert_forward:
            for a in mods:
                if a.position_embedding_type != "absolute":
                    raise NotImplementedError("qkv.hf: position_embedding_type %r is not supported "
                                              "(absolute only)" % a.position_embedding_type)
        plans.append((m, mods, forward))
    for m, mods, how in plans:
        if mods is None:
            _use_interface(m, how)
            continue
        for a in mods:
            a.forward = how.__get__(a, type(a))
            setattr(a, _ATTR, True)
    return model


def restore(model):
    """Undoes use_qkv: the model's attention modules run their own forward
    again. A model use_qkv did not change is left as it is. Returns the model."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("qkv.hf: expected a transformers model, not %s" % type(model).__name__)
    for m in model.modules():
        if getattr(m, _ATTR, False):
            del m.forward
            delattr(m, _ATTR)
        impl = getattr(m, _IMPL_ATTR, None)
        if impl is not None:
            m.config._attn_implementation = impl
            delattr(m, _IMPL_ATTR)
    return model
