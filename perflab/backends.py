"""Torch backend switches that perflab sets and puts back (TF32, the SDPA backend): one place, for the levers, the plan,
calibrate and the compiled decode step."""
from __future__ import annotations

from typing import Callable, ContextManager

import torch


def set_tf32(enabled: bool) -> Callable[[], None]:
    """Let fp32 matmuls and cuDNN convolutions use TF32 (or forbid it); returns a function that puts back what it changed.

    Only a switch whose value differs is written. On torch >= 2.9 the legacy setters also write the per-backend
    `fp32_precision` flags (`set_float32_matmul_precision("highest")` leaves cuda.matmul at "ieee", not the
    untouched "none"), so writing a value the process already had is not harmless: under that state torch 2.14's
    Inductor-compiled CPU matmul aborts the process."""
    restores: list[Callable[[], None]] = []
    matmul = torch.get_float32_matmul_precision()
    if (matmul != "highest") != enabled:
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        restores.append(lambda: torch.set_float32_matmul_precision(matmul))
    cudnn = torch.backends.cudnn.allow_tf32
    if cudnn != enabled:
        torch.backends.cudnn.allow_tf32 = enabled
        restores.append(lambda: setattr(torch.backends.cudnn, "allow_tf32", cudnn))

    def restore() -> None:
        for undo in reversed(restores):
            undo()
    return restore


BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}


def sdpa_context(backend: str) -> Callable[[], ContextManager]:
    """A factory of `sdpa_kernel(<backend>)` contexts (torch >= 2.3)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    chosen = getattr(SDPBackend, BACKENDS[backend])
    return lambda: sdpa_kernel(chosen)


def bf16_is_native(device: torch.device) -> bool:
    """Whether `device` computes bf16 in bf16: a GPU that supports it, a CPU whose oneDNN has bf16 instructions
    (AVX-512 BF16, AMX). On an AVX2-only CPU oneDNN converts to fp32 and back, so bf16 costs time and temporaries
    instead of saving them (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA lower what it may use)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    onednn_bf16 = _onednn_bf16()
    if not onednn_bf16:
        return False
    # oneDNN also says yes on AVX-512 without its bf16 extension (a Xeon of 2.8 GHz here: avx512f, no avx512_bf16),
    # where it converts to fp32 and back as on AVX2: the instructions themselves decide, where torch can ask for them
    hardware = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(callable(check) for check in hardware):
        return any(bool(check()) for check in hardware)
    return True


def _onednn_bf16() -> bool:
    """Whether oneDNN offers bf16 kernels here (within ONEDNN_MAX_CPU_ISA)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def cpu_capability() -> str:
    """The instruction set ATen's CPU kernels use here (AVX2, AVX512 ...), as torch reports it."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch < 2.1
        return "unknown"
