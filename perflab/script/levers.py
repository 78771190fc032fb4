"""What perflab's levers are in a script's own code: a script takes no lever flags, its author edits the code."""
from __future__ import annotations

IN_CODE = {
    "workers": "DataLoader(..., num_workers=N)",
    "persistent-workers": "DataLoader(..., num_workers=N, persistent_workers=True)",
    "prefetch-factor": "DataLoader(..., num_workers=N, prefetch_factor=4)",
    "pin-memory": "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
    "prefetcher-stream": "copy the next batch on a side torch.cuda.Stream while the current one computes",
    "augment-gpu": "run the per-batch augmentation on the GPU after the copy, not per item in the Dataset",
    "augment-gpu-stream": "run the per-batch augmentation on the GPU, on a side stream one batch ahead",
    "tf32": "torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True",
    "bf16": "with torch.autocast('cuda', dtype=torch.bfloat16): around the forward and the loss",
    "fp16": "torch.autocast('cuda', dtype=torch.float16) with a torch.amp.GradScaler",
    "channels-last": "model.to(memory_format=torch.channels_last), and the same for the image inputs",
    "sdpa-flash": "with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION): around attention",
    "sdpa-efficient": "with torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION): around attention",
    "foreach-optimizer": "the optimizer with foreach=True",
    "fused-optimizer": "the optimizer with fused=True (Adam, AdamW, SGD on CUDA)",
    "activation-checkpointing": "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) around blocks",
    "compile": "model = torch.compile(model)",
    "cuda-graphs": "model = torch.compile(model, mode='reduce-overhead')",
    "pipeline-streams": "run the frozen front of the model one batch ahead on its own CUDA stream",
}


def levers_in_code(levers: list[str]) -> dict[str, str]:
    """{lever: how to apply it in the script} for the levers that have a known equivalent, in order."""
    return {lever: IN_CODE[lever] for lever in levers if lever in IN_CODE}
