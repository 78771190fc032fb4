"""Token generation: KV caches, greedy and speculative decoding, request metrics and the bandwidth bound.

    decoder.py      the built-in GPT-style Decoder and its sizes
    kv_cache.py     dynamic and static (pre-allocated) KV caches
    session.py      prefill / extend / truncate over the Decoder or a transformers-convention causal LM
    decode.py       greedy decoding, timed per token
    speculative.py  speculative decoding (draft proposes K, target verifies in one forward)
    metrics.py      TTFT, TPOT, ITL, goodput; bytes per decode step and the bandwidth bound
    requests.py     prompts and length distributions
    corpus.py       the synthetic language and the trained target/draft pair (cached)
    quantize.py     torchao weight quantization (optional extra)
    plan.py         how generation plugs into the harness (settings, step, hook)
    workload.py     causal_lm_workload(): your own causal LM as a workload
"""
from perflab.generation.plan import GenerationSpec
from perflab.generation.workload import causal_lm_workload

__all__ = ["GenerationSpec", "causal_lm_workload"]
