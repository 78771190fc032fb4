"""The Llama sizes as transformers models: a LlamaConfig of a DecoderSize, and perflab's Decoder weights copied into a
LlamaForCausalLM (same logits). transformers is optional and imported only here, when asked for.

The weights map one to one, except that perflab keeps the query/key/value projections as one matrix (`qkv`) and the
SwiGLU gate and up projections as one (`gate_up`): one matrix-vector product each per decode step instead of three
and two. Both use the same RoPE convention (pair i with i + head_dim/2), so no permutation is needed.
"""
from __future__ import annotations

from typing import Any

import torch

from perflab.errors import PerflabError
from perflab.models.decoder import Decoder, DecoderSize

INSTALL_HINT = "pip install 'perflab[models]'"


def llama_config_dict(size: DecoderSize) -> dict[str, Any]:
    """A transformers LlamaConfig's settings (config.json's keys) for `size`, a llama-family size; plain RoPE."""
    if size.family != "llama":
        raise PerflabError(f"a Llama config needs a llama-family size, got family {size.family!r}")
    return dict(vocab_size=size.vocab, hidden_size=size.dim, intermediate_size=size.ffn_dim,
                num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
                max_position_embeddings=size.max_seq, rope_theta=size.rope_theta, rms_norm_eps=size.norm_eps,
                tie_word_embeddings=size.tied, attention_bias=False, mlp_bias=False, hidden_act="silu")


def llama_config(size: DecoderSize, **overrides: Any):
    """A transformers LlamaConfig of the same shape as `size`."""
    settings = llama_config_dict(size)
    try:
        from transformers import LlamaConfig
    except ImportError:
        raise PerflabError(f"a transformers Llama needs transformers: {INSTALL_HINT}") from None
    return LlamaConfig(**{**settings, **overrides})


@torch.no_grad()
def copy_into_hf_llama(decoder: Decoder, hf_model: torch.nn.Module) -> torch.nn.Module:
    """Copy a llama-family Decoder's weights into a LlamaForCausalLM of the same config; returns the HF model."""
    size = decoder.size
    kv_dim = size.kv_heads * size.head_dim
    inner = hf_model.model
    inner.embed_tokens.weight.copy_(decoder.token_embedding.weight)
    for ours, theirs in zip(decoder.blocks, inner.layers):
        q, k, v = ours.attention.qkv.weight.split((size.dim, kv_dim, kv_dim), dim=0)
        for target, source in ((theirs.self_attn.q_proj, q), (theirs.self_attn.k_proj, k),
                               (theirs.self_attn.v_proj, v), (theirs.self_attn.o_proj, ours.attention.proj.weight),
                               (theirs.input_layernorm, ours.norm1.weight),
                               (theirs.post_attention_layernorm, ours.norm2.weight),
                               (theirs.mlp.down_proj, ours.mlp.down.weight)):
            target.weight.copy_(source)
        gate, up = ours.mlp.gate_up.weight.chunk(2, dim=0)
        theirs.mlp.gate_proj.weight.copy_(gate)
        theirs.mlp.up_proj.weight.copy_(up)
    inner.norm.weight.copy_(decoder.norm.weight)
    if not size.tied:
        hf_model.lm_head.weight.copy_(decoder.head.weight)
    return hf_model
