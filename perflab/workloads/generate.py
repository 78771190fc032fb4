"""generate: a decoder generating tokens with a KV cache (TTFT, TPOT, share of the bandwidth bound).

One timed step is one request batch: the prefill of its prompts, then one decode step per output token.
Options: size (perflab/models/decoder.py's SIZES: the GPT-style tiny|125m|350m|1b, default tiny on a CPU and 125m
on a GPU; the Llama-shaped llama-tiny|llama-1b|llama-8b: grouped-query attention, RoPE, SwiGLU, RMSNorm, vocabulary
128256), prompt_len and output_len (a number
or a range low-high, drawn per request batch), weights=random|trained (trained: the decoder trained briefly on
the synthetic language, cached on first use, every size but llama-8b; the default with --speculative and no --draft,
whose built-in draft is trained on the same language; the quality gate needs it to judge --quantize: a random
model's predictions are too flat), decode_tuning=gpt-fast|autotune|torchao|mm-templates|off (with --compile: the
decode step's Inductor settings: gpt-fast's, the default with --quantize; autotune: gpt-fast's plus a wider search of
reduction configs; torchao: torchao's recommended ones; mm-templates: Inductor's Triton matmul templates, autotuned;
off: the compile mode's alone, cuBLAS multiplying the matrices, the default for plain weights;
perflab/generation/compiled_decode.py), decode_graphs=perflab|inductor (with a compile
mode that captures CUDA graphs, on a GPU: perflab captures the compiled step, the default; inductor: Inductor's
cudagraph trees do). docs/generate.md has the levers and the metrics.
"""
from __future__ import annotations

from perflab.errors import PerflabError
from perflab.models.language import TRAINABLE_SIZES, SyntheticLanguage, trained_decoder
from perflab.models.decoder import DRAFT_SIZES, SIZES, Decoder
from perflab.workloads.generation import DECODE_TUNINGS, GenerationSpec
from perflab.workloads.generation import Requests, collate_requests, parse_lengths
from perflab.workloads.base import Workload

DESCRIPTION = ("decoder (GPT-style, or Llama-shaped: size=llama-1b|llama-8b) generating tokens with a KV cache: TTFT, "
               "TPOT, % of the memory-bandwidth bound; options size, prompt_len, output_len, weights, decode_tuning, "
               "decode_graphs")
DEFAULT_BATCH = {"cpu": 1, "cuda": 1}
KNOWN_OPTIONS = {"size", "prompt_len", "output_len", "weights", "decode_tuning", "decode_graphs"}
DECODE_GRAPHS = ("perflab", "inductor")
EVAL_SEQUENCES = 4  # sequences in the quality gate's perplexity set


def build(cfg) -> Workload:
    on_gpu = cfg.device == "cuda"
    opts = cfg.workload_options
    unknown = set(opts) - KNOWN_OPTIONS
    if unknown:
        raise PerflabError(f"generate: unknown option(s) {', '.join(sorted(unknown))}; it takes "
                           f"{', '.join(sorted(KNOWN_OPTIONS))}")
    size_name = opts.get("size", "125m" if on_gpu else "tiny")
    if size_name not in SIZES:
        raise PerflabError(f"generate: size must be one of {', '.join(SIZES)}, got {size_name!r}")
    size = SIZES[size_name]
    tiny = size_name.endswith("tiny")
    prompt_lengths = parse_lengths(opts.get("prompt_len", "16-32" if tiny else "128"), "prompt_len")
    output_lengths = parse_lengths(opts.get("output_len", "16" if tiny else "128"), "output_len")
    builtin_draft = cfg.speculative is not None and not cfg.draft
    draft_size = DRAFT_SIZES.get(size_name)
    if builtin_draft and draft_size is None:
        raise PerflabError(f"generate: size {size_name} has no built-in draft (those exist for "
                           f"{', '.join(DRAFT_SIZES)}): give --draft for --speculative")
    weights = opts.get("weights", "trained" if builtin_draft else "random")
    if weights not in ("random", "trained"):
        raise PerflabError(f"generate: weights must be random or trained, got {weights!r}")
    if weights == "trained" and size_name not in TRAINABLE_SIZES:
        raise PerflabError(f"generate: weights=trained trains {size_name} with AdamW in fp32 (16 bytes per parameter, "
                           f"over any one GPU at this size); trained weights exist for {', '.join(TRAINABLE_SIZES)}")
    if builtin_draft and weights == "random":
        raise PerflabError("the built-in draft is trained on the synthetic language and would agree with a random "
                           "target only by chance: drop weights=random, or give your own --draft")
    tuning = opts.get("decode_tuning")  # None: the default for the weights' kernel (generation/plan.py)
    if tuning is not None and tuning not in DECODE_TUNINGS:
        raise PerflabError(f"generate: decode_tuning must be one of {', '.join(DECODE_TUNINGS)}, got {tuning!r}")
    graphs = opts.get("decode_graphs", "perflab")
    if graphs not in DECODE_GRAPHS:
        raise PerflabError(f"generate: decode_graphs must be perflab or inductor, got {graphs!r}")
    import torch
    device = torch.device("cuda" if on_gpu else "cpu")
    info = {"size": size_name, **size.__dict__, "prompt_len": prompt_lengths, "output_len": output_lengths,
            "weights": weights}
    if weights == "trained":
        model, info["training"] = trained_decoder(size_name, "target", size, device)
    else:
        with device:  # initialised where it runs: a 1b model's weights are drawn in a moment on a GPU
            model = Decoder(size)

    def load_builtin_draft() -> Decoder:
        draft, how = trained_decoder(size_name, "draft", draft_size, device)
        info["draft"] = {**draft_size.__dict__, "training": how}
        return draft
    language = SyntheticLanguage(size.vocab)
    spec = GenerationSpec(vocab=size.vocab, prompt_lengths=prompt_lengths, output_lengths=output_lengths,
                          eval_sequences=language.sample(EVAL_SEQUENCES, min(size.max_seq, 128), seed=99),
                          context_limit=size.max_seq, builtin_draft=load_builtin_draft if draft_size else None,
                          builtin_decoder=True,
                          decode_tuning=tuning, decode_graphs=graphs)
    return Workload(
        name="generate",
        model=model.eval(),
        dataset=Requests(size.vocab, prompt_lengths, output_lengths, seed=cfg.seed),
        collate_fn=collate_requests,
        description=DESCRIPTION,
        uses_attention=True,
        generation=spec,
        info=info,
    )
