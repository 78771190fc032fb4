"""A transformers LlamaForCausalLM at one of perflab's Llama shapes, generating through perflab's plugin path in one of
two ways (`--option loop=...`):

- `loop=generate` (default): the user's own loop, `model.generate(..., cache_implementation="static")`, timed whole
  by perflab (the loop path, perflab/generation/loop_timing.py): what a user of generate gets, its per-token Python
  work (logits processors, stopping criteria, cache bookkeeping) included;
- `loop=step`: the model's one-token step as generate calls it, through perflab's decode loop (the step path): a
  StaticCache allocated once per request batch, the prefill eager, every one-token step through the model's own
  compiled call (`get_compiled_call`: torch.compile with its generation_config's compile settings, reduce-overhead:
  CUDA graphs). The model's own speed, without generate's loop; with both runs, `perflab compare` says how much the
  loop adds per token.

    perflab run --workload examples/hf_llama.py --mode infer --precision bf16 --option size=llama-1b --batch 8
    perflab run --workload examples/hf_llama.py --mode infer --precision bf16 --option size=llama-1b --batch 8 \
                --option loop=step

Random weights (nothing is downloaded): `size` is llama-tiny (CPU default), llama-1b (GPU default) or llama-8b, the
shapes of perflab's `--workload generate --option size=...` (perflab/models/decoder.py). `static=0` leaves the model's
own growing cache and eager calls (generate without cache_implementation). `sync_per_token=1` (loop=step) waits for
each token before the next step, as generate does in transformers versions that check after every token whether all
sequences finished (later ones defer that check). Needs `pip install 'perflab[models]'`.
benchmarks/bench_generate_peers.py times both beside transformers' own timing of generate().
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

import perflab
from perflab.generation import causal_lm_workload
from perflab.models.decoder import SIZES
from perflab.models.hf_llama import llama_config
from perflab.workloads.generation import parse_lengths
from perflab.workloads.settings import ByDevice, resolve_settings, setting

LLAMA_SIZES = tuple(name for name, size in SIZES.items() if size.family == "llama")
OPTIONS = (
    setting("size", str, "a Llama shape of perflab's generate workload", ByDevice("llama-1b", "llama-tiny"),
            choices=LLAMA_SIZES),
    setting("prompt_len", str, "prompt length: a number or a range low-high", ByDevice("128", "16-32")),
    setting("output_len", str, "tokens generated per request: a number or a range", ByDevice("128", "16")),
    setting("static", int, "1: StaticCache + compiled one-token steps, as generate(cache_implementation='static')",
            ByDevice(1, 0), choices=(0, 1)),
    setting("sync_per_token", int, "1 (loop=step): wait for each token before the next step (generate's per-token "
            "stop check)", 0, choices=(0, 1)),
    setting("loop", str, "what perflab times: generate (model.generate itself, whole) or step (the model's one-token "
            "step as generate calls it, through perflab's decode loop)", "generate", choices=("generate", "step")),
)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Parameters made in `dtype` (an 8B model drawn in fp32 first would need 32 GB)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def hf_llama(size_name: str, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    """LlamaForCausalLM(LlamaConfig(...)) of perflab's `size_name` shape, random weights, made on `device`."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError:
        raise perflab.PerflabError("examples/hf_llama.py needs transformers: pip install 'perflab[models]'") from None
    torch.manual_seed(seed)
    with device, default_dtype(dtype):
        return LlamaForCausalLM(llama_config(SIZES[size_name])).eval()


def static_cache(config, batch: int, max_cache_len: int, device: torch.device, dtype: torch.dtype):
    """A transformers StaticCache (5.x sizes it at its first write; 4.x takes batch, device and dtype up front)."""
    from transformers import StaticCache
    try:
        return StaticCache(config=config, max_cache_len=max_cache_len)
    except TypeError:
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_cache_len, device=device,
                           dtype=dtype)


class GenerateLikeLM(nn.Module):
    """A transformers causal LM called as generate(cache_implementation="static") calls it, behind the transformers
    calling convention perflab's plugin path uses (input_ids, attention_mask, past_key_values, use_cache)."""

    def __init__(self, model: nn.Module, max_cache_len: int, sync_per_token: bool = False):
        super().__init__()
        self.model, self.max_cache_len, self.sync_per_token = model, max_cache_len, sync_per_token
        self.config = model.config
        self.filled: dict[int, int] = {}  # positions written per cache object (asking the cache may read the GPU)
        self.cache = None  # one cache reused across request batches, as generate reuses its own: its buffers keep
        # their addresses, which the compiled call (and its CUDA graphs) is specialised on

    def compiled_call(self):
        """The model's own compiled call with generate's compile settings (cached on the model by transformers)."""
        get_compiled = getattr(self.model, "get_compiled_call", None)
        if get_compiled is None:  # transformers before 4.48: what its docs said to do
            if not hasattr(self, "_compiled"):
                self._compiled = torch.compile(self.model.forward, mode="reduce-overhead", fullgraph=True)
            return self._compiled
        return get_compiled(getattr(self.model.generation_config, "compile_config", None))

    def forward(self, input_ids: torch.Tensor, attention_mask=None, past_key_values=None, use_cache: bool = True):
        batch, count = input_ids.shape
        if past_key_values is None:  # a new request batch: the cache emptied (a new one only for a new batch size)
            if self.cache is None or self.cache_batch != batch:
                self.cache = static_cache(self.config, batch, self.max_cache_len, input_ids.device, self.model.dtype)
                self.cache_batch = batch
            else:
                self.cache.reset()
            past_key_values = self.cache
            self.filled = {id(past_key_values): 0}
        start = self.filled.get(id(past_key_values), 0)
        positions = torch.arange(start, start + count, device=input_ids.device)
        decoding = count == 1 and input_ids.device.type == "cuda"
        if decoding and self.sync_per_token:
            torch.cuda.current_stream().synchronize()
        call = self.compiled_call() if decoding else self.model
        # no attention mask: no padding, and the mask the model builds from cache_position keeps static shapes
        output = call(input_ids=input_ids, past_key_values=past_key_values, cache_position=positions, use_cache=True)
        self.filled[id(past_key_values)] = start + count
        return output


def generate_call(model: nn.Module, static: bool):
    """`generate_fn(input_ids, max_new_tokens)`: model.generate as a user calls it, greedy, exactly max_new_tokens
    tokens (min_new_tokens too: random weights may draw the end-of-sequence token), with a static cache (and generate's
    own compiled one-token steps on a GPU) when `static`."""
    settings = {"do_sample": False, "pad_token_id": 0, **({"cache_implementation": "static"} if static else {})}

    def generate(input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        return model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                              min_new_tokens=max_new_tokens, **settings)
    return generate


def check_loop_options(loop: str, sync_per_token: bool) -> None:
    if loop == "generate" and sync_per_token:
        raise perflab.PerflabError("--option sync_per_token=1 applies to loop=step: with loop=generate, generate "
                                   "itself decides when it waits; drop sync_per_token or add --option loop=step")


def workload(model: nn.Module, cfg, size_name: str, static: bool, sync_per_token: bool, prompt_len: str,
             output_len: str, loop: str = "generate") -> perflab.Workload:
    """The plugin-path Workload of an (already built) transformers Llama: generate timed whole (loop="generate") or
    its one-token step through perflab's decode loop (loop="step")."""
    size = SIZES[size_name]
    check_loop_options(loop, sync_per_token)
    common = dict(name=f"hf-{size_name}", prompt_len=prompt_len, output_len=output_len, context_limit=size.max_seq)
    cache = ", static cache + compiled steps" if static else ""
    if loop == "generate":
        return causal_lm_workload(model, size.vocab, cfg, generate_fn=generate_call(model, static), **common,
                                  description=f"transformers LlamaForCausalLM at {size_name}'s shape, "
                                              f"model.generate timed whole{cache}")
    longest = parse_lengths(prompt_len, "prompt_len")[1] + parse_lengths(output_len, "output_len")[1]
    runner = GenerateLikeLM(model, longest, sync_per_token) if static else model
    return causal_lm_workload(runner, size.vocab, cfg, **common,
                              description=f"transformers LlamaForCausalLM at {size_name}'s shape, its step through "
                                          f"perflab's decode loop{cache + ' as generate()' if static else ''}")


def build(cfg) -> perflab.Workload:
    options = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    device = torch.device("cuda" if cfg.device == "cuda" else "cpu")
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
    check_loop_options(options["loop"], bool(options["sync_per_token"]))  # before building a model of gigabytes
    model = hf_llama(options["size"], device, dtype, cfg.seed)
    return workload(model, cfg, options["size"], bool(options["static"]), bool(options["sync_per_token"]),
                    options["prompt_len"], options["output_len"], options["loop"])
