"""Torch backend switches that perflab sets and puts back (TF32, the SDPA backend): one place, for the levers, the plan,
calibrate and the compiled decode step."""
from __future__ import annotations

from typing import Callable, ContextManager

import torch


def set_tf32(enabled: bool) -> Callable[[], None]:
    """Switch TF32 for matmuls and cuDNN convolutions; returns a function that restores the old state."""
    old_matmul = torch.get_float32_matmul_precision()
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled

    def restore() -> None:
        torch.set_float32_matmul_precision(old_matmul)
        torch.backends.cudnn.allow_tf32 = old_cudnn
    return restore


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_context(backend: str) -> Callable[[], ContextManager]:
    """A factory of `sdpa_kernel(<backend>)` contexts (torch >= 2.3)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = getattr(SDPBackend, BACKENDS[backend])
    return lambda: sdpa_kernel(chosen)
