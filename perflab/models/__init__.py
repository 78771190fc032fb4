"""Models the built-in workloads build: the GPT block shared by the transformer and the Decoder (gpt.py), the Decoder
and its sizes (decoder.py), its KV caches (kv_cache.py), the synthetic language it is trained on (language.py), and
how to read a causal LM's outputs whatever their type (outputs.py). They depend on torch and perflab's errors only."""
