"""Models the built-in workloads build: the decoder block in its GPT and Llama families, shared by the transformer and
the Decoder (gpt.py), the Decoder and its sizes (decoder.py), its KV caches (kv_cache.py), the synthetic language it
is trained on (language.py), how to read a causal LM's outputs whatever their type (outputs.py), and the Llama sizes
as transformers models (hf_llama.py: transformers imported only there, when asked for). They depend on torch and
perflab's errors only."""
