"""The measurement stage: the timed loop, warm-up to a steady state, trials, the NVML sampler, interference, progress."""
