"""A plain transformers-style training script: a GPT-style causal LM fed dict batches, trained with AdamW.

    python benchmarks/scripts/gpt_train.py --batch 32 --precision bf16 --steps 60 [--model auto|hf|mini]

With transformers installed (`--model auto` or `hf`) the model is a randomly initialised GPT2LMHeadModel,
called as `model(**batch)` the way Hugging Face scripts do; without it (or `--model mini`), a small
hand-written GPT with the same call signature. It prints its own throughput as one JSON line.

The same file is a perflab plugin, for comparison: `perflab run --workload benchmarks/scripts/gpt_train.py:build
--batch 32 --precision bf16` builds the identical model, data and optimizer.
"""
import argparse
import json
import time

import torch
from torch import nn
from torch.nn import functional as F

SIZES = dict(layers=6, width=512, heads=8, seq_len=256, vocab=8192)


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, width // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.norm2(x))


class MiniGPT(nn.Module):
    """A GPT-2-shaped decoder, called like a Hugging Face model: model(input_ids=..., attention_mask=...)."""

    def __init__(self, layers: int, width: int, heads: int, seq_len: int, vocab: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids, attention_mask=None):
        x = self.tokens(input_ids) + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return {"logits": self.head(self.norm(x))}


def make_model(kind: str) -> nn.Module:
    """GPT2LMHeadModel when transformers is there (kind auto/hf), else MiniGPT."""
    if kind in ("auto", "hf"):
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            if kind == "hf":
                raise
        else:
            config = GPT2Config(n_layer=SIZES["layers"], n_embd=SIZES["width"], n_head=SIZES["heads"],
                                n_positions=SIZES["seq_len"], vocab_size=SIZES["vocab"])
            return GPT2LMHeadModel(config)
    return MiniGPT(**SIZES)


def causal_lm_loss(output, labels):
    """Next-token cross-entropy on the logits of a dict, a ModelOutput or a tensor."""
    logits = output["logits"] if isinstance(output, dict) or hasattr(output, "keys") else output
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())


class TokenBatches(torch.utils.data.Dataset):
    """Random token sequences as Hugging Face datasets give them: ({"input_ids", "attention_mask"}, labels)."""

    def __init__(self, length: int = 4096, seed: int = 0):
        self.ids = torch.randint(0, SIZES["vocab"], (length, SIZES["seq_len"]),
                                 generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        ids = self.ids[index]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ids


class KeywordCall(nn.Module):
    """Calls the model with a dict batch as keyword arguments (how perflab's harness feeds a plugin)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs=None, **kwargs):
        return self.model(**(inputs if inputs is not None else kwargs))


def build(cfg):
    """The same model, data, loss and optimizer as the script, as a perflab Workload."""
    import perflab
    torch.manual_seed(cfg.seed)
    return perflab.Workload(
        name="gpt-script-plugin", model=KeywordCall(make_model(cfg.workload_options.get("model", "auto"))),
        dataset=TokenBatches(seed=cfg.seed), loss_fn=causal_lm_loss, uses_attention=True, default_data="device",
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1),
        description="benchmarks/scripts/gpt_train.py as a plugin")


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--device", default="cuda", help="cpu for a quick smoke test")
    parser.add_argument("--model", choices=["auto", "hf", "mini"], default="auto")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32, as in perflab's runs
    torch.set_float32_matmul_precision("highest")
    model = make_model(args.model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    dataset = TokenBatches()
    staged = []
    for first in range(0, 4 * args.batch, args.batch):  # four distinct batches on the GPU, as perflab pre-stages
        items = [dataset[i] for i in range(first, first + args.batch)]
        inputs = {key: torch.stack([item[0][key] for item in items]).to(device) for key in items[0][0]}
        staged.append((inputs, torch.stack([item[1] for item in items]).to(device)))

    for step in range(args.steps):
        if step == args.warmup:
            synchronize(device)
            began = time.perf_counter()
        batch, labels = staged[step % len(staged)]
        with autocast:
            output = model(**batch)
            loss = causal_lm_loss(output, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    elapsed = time.perf_counter() - began
    timed = args.steps - args.warmup
    print(json.dumps({"script": "gpt_train", "model": type(model).__name__, "steps_per_s": timed / elapsed,
                      "samples_per_s": timed * args.batch / elapsed, "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
