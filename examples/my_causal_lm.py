"""A causal LM of your own, generating through perflab (the transformers calling convention, no transformers).

    perflab run --workload examples/my_causal_lm.py:build --mode infer
    perflab run --workload examples/my_causal_lm.py:build --mode infer --speculative 3 --draft examples/my_causal_lm.py:build_draft

TinyCausalLM takes input_ids / attention_mask / past_key_values / use_cache and returns a dict with logits and
past_key_values (one (keys, values) pair per layer), as a transformers model does. Any
AutoModelForCausalLM.from_pretrained(...) model can take its place.
"""
import torch
import torch.nn.functional as F
from torch import nn

from perflab.generation import causal_lm_workload

VOCAB = 512


class TinyCausalLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 256):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_positions, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        batch, length = input_ids.shape
        past_length = past_key_values[0][0].shape[2] if past_key_values else 0
        where = torch.arange(past_length, past_length + length, device=input_ids.device)
        x = self.embed(input_ids) + self.positions(where)
        present = []
        for index, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in qkv(x).chunk(3, dim=-1))
            if past_key_values:
                k = torch.cat([past_key_values[index][0], k], dim=2)
                v = torch.cat([past_key_values[index][1], v], dim=2)
            present.append((k, v))
            seen = torch.arange(past_length + length, device=input_ids.device)
            mask = seen[None, :] <= where[:, None]
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + out(attended.transpose(1, 2).reshape(batch, length, -1))
        logits = self.lm_head(self.norm(x))
        return {"logits": logits, "past_key_values": tuple(present) if use_cache else None}


def build(cfg):
    torch.manual_seed(cfg.seed)
    return causal_lm_workload(TinyCausalLM(), VOCAB, cfg, name="my-causal-lm", context_limit=256)


def build_draft(cfg):
    torch.manual_seed(cfg.seed + 1)
    return TinyCausalLM(dim=32, layers=1, heads=2)
