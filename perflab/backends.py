"""Process-wide torch backend switches that perflab sets and puts back: one place, for levers, the plan and calibrate."""
from __future__ import annotations

from typing import Callable

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
