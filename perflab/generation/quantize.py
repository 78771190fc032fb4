"""--quantize: weight quantization of the model's linear layers through torchao (an optional extra).

torchao changed its API: newer releases take config objects (`quantize_(model, Int8WeightOnlyConfig())`), older
ones factory functions (`quantize_(model, int8_weight_only())`). Both are supported; torchao is imported only
when a scheme is asked for.

int8-weight is per-row (one scale per output channel). torchao's linear for it (0.18: Int8Tensor) is gpt-fast's
WeightOnlyInt8Linear: `mm(x, w_int8.t().to(x.dtype)) * scale`. Eager, that converts every weight to bf16 before the
matmul (more bytes moved than bf16 weights: slower); compiled with coordinate descent tuning, Inductor turns the
batch-1 product into one multiply-and-reduce kernel that reads the int8 weight once (compiled_decode.py). torchao
would switch that tuning on for the whole process when quantizing (`set_inductor_config`, on by default for every
scheme, int4 included); it is asked not to, because the compiled decode step sets it for itself, and nothing else in
the run should change (a later compile in the same process, e.g. the next sweep point, would inherit it).
"""
from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import nn

from perflab.errors import PerflabError

INSTALL_HINT = "pip install 'perflab[quant]'"
# scheme -> (new config class, old factory function, keyword arguments)
SCHEMES = {
    "int8-weight": ("Int8WeightOnlyConfig", "int8_weight_only", {}),
    "fp8": ("Float8WeightOnlyConfig", "float8_weight_only", {}),
    "int4-weight": ("Int4WeightOnlyConfig", "int4_weight_only", {"group_size": 128}),
}
INT4_KERNEL_FORMAT = "tile_packed_to_4d"  # torchao >= 0.14: the tinygemm kernel's layout (no extra packages)


def torchao_missing() -> Optional[str]:
    """Why torchao cannot be used here, or None."""
    try:
        import torchao.quantization  # noqa: F401
    except ImportError as err:
        return f"--quantize needs torchao, which is not importable here ({err.name or err}): {INSTALL_HINT}"
    return None


def scheme_refusal(scheme: str, device: torch.device, precision: str) -> Optional[str]:
    """What the scheme needs that this run lacks (the CUDA-only schemes are refused by the option table)."""
    if scheme == "int4-weight" and precision != "bf16":
        return "int4-weight runs torchao's tinygemm kernel on bf16 weights: add --precision bf16"
    if scheme == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"fp8 needs a GPU with compute capability 8.9 or newer (Ada, Hopper); {torch.cuda.get_device_name(device)} is older"
    return torchao_missing()


def quantization_config(scheme: str) -> Any:
    """The torchao config (new API) or factory result (old API) for `scheme`: int4 in tinygemm's layout, and torchao
    asked not to change Inductor's settings for the whole process (each, where this torchao's config takes it)."""
    import torchao.quantization as tq
    new_name, old_name, kwargs = SCHEMES[scheme]
    config_class = getattr(tq, new_name, None)
    if config_class is not None:
        extras = {"set_inductor_config": False}
        if scheme == "int4-weight":  # before the packing-format argument, the default layout was tinygemm's
            extras["int4_packing_format"] = INT4_KERNEL_FORMAT
        accepted = inspect.signature(config_class).parameters
        return config_class(**kwargs, **{name: value for name, value in extras.items() if name in accepted})
    factory = getattr(tq, old_name, None)
    if factory is None:
        raise PerflabError(f"this torchao ({getattr(__import__('torchao'), '__version__', '?')}) has neither "
                           f"{new_name} nor {old_name}: {INSTALL_HINT} installs a supported one (>= 0.8)")
    return factory(**kwargs)


def quantize_weights(model: nn.Module, scheme: str) -> nn.Module:
    """Quantize every nn.Linear of `model` in place with torchao's `scheme`; returns the model."""
    from torchao.quantization import quantize_
    quantize_(model, quantization_config(scheme))
    return model
