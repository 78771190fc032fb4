"""Token generation, measured: greedy and speculative decoding, request metrics and the bandwidth bound.

    session.py          prefill / extend / truncate over perflab's Decoder or a transformers-convention causal LM
    compiled_decode.py  the decode step compiled with named Inductor settings
    decode_graph.py     the compiled decode step captured in a CUDA graph
    decode.py           greedy decoding, timed per token
    speculative.py      speculative decoding (draft proposes K, target verifies in one forward)
    metrics.py          TTFT, TPOT, ITL, goodput; bytes per decode step and the bandwidth bound
    loop_timing.py      a workload's own generation loop (generate_fn, e.g. model.generate) timed whole: the loop path
    quantize.py         torchao weight quantization (optional extra)
    plan.py             how generation plugs into the harness (settings, step, hook)

The model side lives with the models and workloads: the Decoder, its KV caches and the synthetic language in
perflab/models/; what a generating workload declares (GenerationSpec), its requests and causal_lm_workload()
in perflab/workloads/.
"""
from perflab.workloads.causal_lm import causal_lm_workload
from perflab.workloads.generation import GenerationSpec

__all__ = ["GenerationSpec", "causal_lm_workload"]
