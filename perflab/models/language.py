"""A learnable synthetic language, and the built-in target/draft pair trained on it (cached on first use).

The same training gives the quality gate a reference worth judging against: a trained target predicts its next token
with confidence, where a random one spreads its guesses almost evenly over the vocabulary (perflab/quality/generation.py).

Random weights make speculative decoding meaningless (a random draft agrees with a random target by chance),
so the built-in demonstration trains both on this language for a short while. The language uses `ACTIVE`
token ids: three quarters of the tokens have one likely successor (a bigram), the rest a likely successor that
depends on the two previous tokens (a trigram table), with some noise. A small draft learns the bigrams
quickly and the trigrams less well than the larger target, so acceptance is high but not perfect.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from perflab.models.decoder import Decoder, DecoderSize
from perflab.models.outputs import output_field

ACTIVE = 256  # token ids the language uses (at most the vocabulary)
LIKELY = 0.9  # probability of the likely successor; otherwise a uniformly random active token
TRIGRAM_SHARE = 0.25  # share of tokens whose successor depends on the two previous tokens
RECIPE_VERSION = 1  # bump when the language or the training recipe changes: cached pairs are retrained
# The sizes `weights=trained` trains (perflab/models/decoder.py's SIZES): AdamW in fp32 holds 16 bytes per parameter
# (weights, gradients, two moments), 20 GB at llama-1b; llama-8b's 128 GB fit no single GPU.
TRAINABLE_SIZES = ("tiny", "125m", "350m", "1b", "llama-tiny", "llama-1b")


class SyntheticLanguage:
    """The language's tables, drawn once from a seed."""

    def __init__(self, vocab: int, seed: int = 1234):
        gen = torch.Generator().manual_seed(seed)
        self.active = min(vocab, ACTIVE)
        self.ids = torch.randperm(vocab, generator=gen)[:self.active]  # spread over the vocabulary
        self.bigram = torch.randint(0, self.active, (self.active,), generator=gen)
        self.trigram = torch.randint(0, self.active, (self.active, self.active), generator=gen)
        self.uses_trigram = torch.rand(self.active, generator=gen) < TRIGRAM_SHARE

    def sample(self, count: int, length: int, seed: int) -> torch.Tensor:
        """(count, length) token ids."""
        gen = torch.Generator().manual_seed(seed)
        index = torch.empty(count, length, dtype=torch.long)
        index[:, :2] = torch.randint(0, self.active, (count, 2), generator=gen)
        noise = torch.rand(count, length, generator=gen) >= LIKELY
        random_next = torch.randint(0, self.active, (count, length), generator=gen)
        for t in range(2, length):
            prev, cur = index[:, t - 2], index[:, t - 1]
            likely = torch.where(self.uses_trigram[cur], self.trigram[prev, cur], self.bigram[cur])
            index[:, t] = torch.where(noise[:, t], random_next[:, t], likely)
        return self.ids[index]


def perplexity(model, sequences: torch.Tensor, batch: int = 4) -> float:
    """exp(mean next-token cross-entropy) of `model` (full forward, logits) over `sequences`."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(sequences), batch):
            chunk = sequences[start:start + batch]
            logits = _logits(model, chunk[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
            total, count = total + float(loss), count + chunk[:, 1:].numel()
    return math.exp(total / count)


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    if isinstance(model, Decoder):
        return model(tokens)
    return output_field(model(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False),
                        "logits", 0)


# ---------------------------------------------------------------------------------------------- training

def training_steps(size: DecoderSize, on_gpu: bool) -> int:
    """Enough steps for the bigrams and most trigrams: seconds on a CPU at tiny, well under a minute on a GPU."""
    return 400 if on_gpu else 150


def train_decoder(size: DecoderSize, seed: int, device: torch.device, steps: int,
                  progress: Optional[Callable[[str], None]] = None) -> Decoder:
    """A Decoder of `size` trained on the synthetic language (AdamW, short warm-up, bf16 autocast on CUDA)."""
    # its own random stream: training on first use must not shift the run's random state
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        return _train(size, seed, device, steps, progress)


def _train(size: DecoderSize, seed: int, device: torch.device, steps: int,
           progress: Optional[Callable[[str], None]]) -> Decoder:
    model = Decoder(size).to(device)
    language = SyntheticLanguage(size.vocab)
    batch, length = (32, 128) if device.type == "cuda" else (8, 48)
    corpus = language.sample(batch * 64, length + 1, seed=seed).to(device)
    lr = 3e-3 if size.dim <= 64 else 1e-3 if size.dim <= 512 else 3e-4
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null()
    model.train()
    for step in range(steps):
        rows = torch.randint(0, len(corpus), (batch,), device=device)
        chunk = corpus[rows]
        with autocast:
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if progress is not None and step % 100 == 0:
            progress(f"training step {step}/{steps}: loss {float(loss):.3f}")
    model.eval()
    return model


def _null():
    import contextlib
    return contextlib.nullcontext()


def cache_dir() -> Path:
    root = os.environ.get("PERFLAB_CACHE_DIR") or Path.home() / ".cache" / "perflab"
    return Path(root) / "generation"


def trained_decoder(size_name: str, role: str, size: DecoderSize, device: torch.device,
                    progress: Optional[Callable[[str], None]] = None) -> tuple[Decoder, dict]:
    """The trained target or draft of `size_name`, from the cache or trained now; (model, how it was made)."""
    on_gpu = device.type == "cuda"
    steps = training_steps(size, on_gpu)
    seed = {"target": 1, "draft": 2}[role]  # separately initialised and trained: the draft is not a copy
    recipe = {"size": size.__dict__, "role": role, "steps": steps, "seed": seed, "version": RECIPE_VERSION,
              "device": device.type}
    key = hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / f"{size_name}-{role}-{key}.pt"
    if path.is_file():
        model = Decoder(size)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model, {"source": "cache", "path": str(path), **recipe}
    began = time.perf_counter()
    model = train_decoder(size, seed, device, steps, progress).cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    # bf16 on disk for the GPU sizes: half the file, and the timed runs use bf16 or fp32 copies of it anyway
    half = size.dim >= 512
    torch.save({name: tensor.bfloat16() if half and tensor.is_floating_point() else tensor
                for name, tensor in model.state_dict().items()}, temp)
    os.replace(temp, path)
    return model, {"source": "trained now", "path": str(path), "train_s": round(time.perf_counter() - began, 1),
                   **recipe}
