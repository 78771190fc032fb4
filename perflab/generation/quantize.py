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

gemlite (--quantize-kernel, GEMLITE_SCHEMES) runs both schemes through its Triton GEMV/GEMM kernels, in torchao's
UIntxBitPackedTensor: int8 through torchao's UIntxWeightOnlyConfig, int4 rounded here (gemlite_int4_weight) because
torchao's config rounds 4-bit weights with HQQ in fp16, and gemlite then builds an fp16 kernel that bf16 activations
cannot enter. `auto` takes gemlite only where it was measured faster and passed the gate (GemliteScheme.auto).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from perflab.errors import PerflabError

INSTALL_HINT = "pip install 'perflab[quant]'"
GEMLITE = "gemlite"


@dataclass(frozen=True)
class GemliteScheme:
    """How a scheme runs through gemlite's Triton kernels, and whether --quantize-kernel auto picks them."""

    bits: int
    group: Optional[int]  # input features per scale; None: one scale per output row
    auto: bool  # auto takes gemlite for this scheme where it is installed
    measured: str  # what the choice rests on (BENCHMARKS.md)


GEMLITE_SCHEMES = {
    "int8-weight": GemliteScheme(8, None, True, "llama-8b on an H100, 2026-11-28: 263.8 tokens/s = 1.71x bf16 at batch "
                                 "1 and 1.34x at batch 8, where Inductor's generated product gave 0.97x (H200); the "
                                 "gate on a trained llama-1b passed (greedy agreement 100%)"),
    "int4-weight": GemliteScheme(4, 128, False, "llama-8b on an H100, 2026-11-28: 1.75x bf16 at batch 1 (tinygemm: "
                                 "1.25x on an H200) but the gate on a trained llama-1b failed: 14 of its logits came "
                                 "back NaN/inf. The likely cause, the output head through gemlite's unmasked 4-bit "
                                 "GEMV (int4_layers_by_kernel), takes tinygemm since; not measured again yet"),
}
KERNEL_WORDS = {"torchao": "torchao's default kernel", GEMLITE: "gemlite's Triton kernels"}
GEMLITE_INSTALL = "pip install 'perflab[quant]' (gemlite < 0.6, pure Python: torchao 0.18 calls gemlite 0.5's API)"
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


def scheme_refusal(scheme: str, device: torch.device, precision: str, kernel: str = "auto") -> Optional[str]:
    """What the scheme (through --quantize-kernel `kernel`) needs that this run lacks (the CUDA-only schemes are
    refused by the option table)."""
    if kernel == GEMLITE:
        missing = gemlite_missing(scheme, device)
        if missing:
            return f"--quantize-kernel gemlite: {missing}"
    if scheme == "int4-weight" and precision != "bf16":
        return "int4-weight runs its 4-bit kernels (tinygemm, gemlite) on bf16 weights: add --precision bf16"
    if scheme == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"fp8 needs a GPU with compute capability 8.9 or newer (Ada, Hopper); {torch.cuda.get_device_name(device)} is older"
    return torchao_missing()


def gemlite_missing(scheme: str, device: torch.device) -> Optional[str]:
    """Why `scheme` cannot run through gemlite's kernels here, or None."""
    if scheme not in GEMLITE_SCHEMES:
        return f"gemlite's kernels take {', '.join(GEMLITE_SCHEMES)} here, not {scheme}"
    if device.type != "cuda":
        return "gemlite's kernels are Triton kernels for a CUDA GPU"
    if importlib.util.find_spec("gemlite") is None:
        return f"gemlite is not importable here: {GEMLITE_INSTALL}"
    version = importlib.metadata.version("gemlite")
    if _release(version) >= (0, 6):
        return (f"gemlite {version} changed the API torchao's gemlite path calls (its tensor arguments): "
                f"{GEMLITE_INSTALL}")
    try:
        from torchao.prototype.quantization.quant_api import UIntxWeightOnlyConfig  # noqa: F401 (a probe)
    except ImportError:
        return "this torchao has no UIntxWeightOnlyConfig (gemlite's path): torchao 0.18 or later has it"
    return None


def _release(version: str) -> tuple[int, ...]:
    """(0, 5, 1) from "0.5.1.post1": the release numbers a version starts with."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def resolved_kernel(scheme: str, requested: str, device: torch.device) -> tuple[str, str]:
    """The kernel --quantize-kernel `requested` means for `scheme` here, and why (for the run's notes)."""
    if requested == "torchao":
        return "torchao", "asked for (--quantize-kernel torchao)"
    missing = gemlite_missing(scheme, device)
    if requested == GEMLITE:
        if missing:
            raise PerflabError(f"--quantize-kernel gemlite refused: {missing}")
        return GEMLITE, "asked for (--quantize-kernel gemlite)"
    if missing:
        return "torchao", f"auto: torchao's default ({missing})"
    if not GEMLITE_SCHEMES[scheme].auto:
        return "torchao", f"auto: torchao's default (gemlite only when asked for: {GEMLITE_SCHEMES[scheme].measured})"
    return GEMLITE, "auto: gemlite is installed and takes this scheme"


def quantization_config(scheme: str, kernel: str = "torchao") -> Any:
    """The torchao config (new API) or factory result (old API) for `scheme` through `kernel`: int4 in tinygemm's
    layout, and torchao asked not to change Inductor's settings for the whole process (each, where this torchao's
    config takes it)."""
    if kernel == GEMLITE:
        from torchao.prototype.quantization.quant_api import UIntxWeightOnlyConfig
        bits, group = GEMLITE_SCHEMES[scheme].bits, GEMLITE_SCHEMES[scheme].group
        if bits != 8:
            raise ValueError(f"{scheme} through gemlite is rounded by gemlite_int4_weight, not a torchao config")
        return UIntxWeightOnlyConfig(group_size=group, bit_width=bits, set_inductor_config=False)
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


def quantize_weights(model: nn.Module, scheme: str, kernel: str = "torchao") -> nn.Module:
    """Quantize every nn.Linear of `model` in place with torchao's `scheme`, for `kernel` (resolved_kernel's);
    returns the model."""
    from torchao.quantization import quantize_
    if kernel == GEMLITE and GEMLITE_SCHEMES[scheme].bits == 4:
        group = GEMLITE_SCHEMES[scheme].group
        _check_groups(model, group)
        through_gemlite, through_tinygemm = int4_layers_by_kernel(model)
        for module in through_gemlite:
            module.weight = nn.Parameter(gemlite_int4_weight(module.weight.detach(), group), requires_grad=False)
        if through_tinygemm:
            chosen = {id(module) for module in through_tinygemm}
            quantize_(model, quantization_config(scheme), filter_fn=lambda module, name: id(module) in chosen)
        return model
    quantize_(model, quantization_config(scheme, kernel))
    return model


# gemlite 0.5's 4-bit matrix-vector kernel (GEMV_REVSPLITK) loads weights and adds into its output in blocks of up to
# 512 output features with no bounds mask, and its autotuner tries 512 wherever its own tuned table has no entry: a
# layer whose outputs are not a multiple of the block reads and writes past its end. Llama-3's output head (128,256
# outputs = 250.5 blocks of 512) is such a layer: the gate on a trained llama-1b found 14 NaN/inf logits
# (BENCHMARKS.md, 2026-11-28). Those layers take tinygemm's int4 (the same rounding scheme, torchao's kernel).
GEMLITE_INT4_OUTPUT_MULTIPLE = 1024  # the kernel's largest block (512) with room for a larger one in a later release


def int4_layers_by_kernel(model: nn.Module) -> tuple[list[nn.Linear], list[nn.Linear]]:
    """The model's linear layers whose int4 products gemlite can run (outputs a multiple of
    GEMLITE_INT4_OUTPUT_MULTIPLE), and the rest (tinygemm)."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    gemlite = [module for module in linears if module.out_features % GEMLITE_INT4_OUTPUT_MULTIPLE == 0]
    return gemlite, [module for module in linears if module.out_features % GEMLITE_INT4_OUTPUT_MULTIPLE]


def kernel_note(model: nn.Module, scheme: str, kernel: str) -> Optional[str]:
    """What the run's notes should add about which layers took which kernel, or None (one kernel for all)."""
    if kernel != GEMLITE or GEMLITE_SCHEMES[scheme].bits != 4:
        return None
    names = {id(module): name for name, module in model.named_modules()}
    _, rest = int4_layers_by_kernel(model)
    if not rest:
        return None
    shown = ", ".join(f"{names[id(m)]} ({m.out_features:,} outputs)" for m in rest[:3])
    return (f"{len(rest)} layer(s) through tinygemm instead of gemlite, their outputs not a multiple of "
            f"{GEMLITE_INT4_OUTPUT_MULTIPLE} (gemlite's 4-bit GEMV has no bounds mask): {shown}")


def _check_groups(model: nn.Module, group: int) -> None:
    uneven = [(name, module.in_features) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and module.in_features % group]
    if uneven:
        name, features = uneven[0]
        raise PerflabError(f"int4-weight through gemlite rounds weights in groups of {group} input features; {name} "
                           f"has {features} ({len(uneven)} such layers): use --quantize-kernel torchao")


def int4_rounding(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values 0..15 as uint8, scales, zero points), asymmetric per `group` input features (torchao's affine
    primitives, min-max): weight ~ (values - zero) * scale, with the scale and zero point in the weight's dtype (what the
    kernel multiplies by) and the rounding done in fp32 against that scale."""
    from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine, quantize_affine
    block, exact = (1, group), weight.float()
    scale, zero = choose_qparams_affine(exact, MappingType.ASYMMETRIC, block, torch.uint8, quant_min=0,
                                        quant_max=15, scale_dtype=torch.float32, zero_point_dtype=torch.float32)
    scale = scale.to(weight.dtype)
    values = quantize_affine(exact, block, scale.float(), zero, torch.uint8, quant_min=0, quant_max=15)
    return values, scale, zero.to(weight.dtype)


def gemlite_int4_weight(weight: torch.Tensor, group: int) -> torch.Tensor:
    """`weight` (out, in; bf16 or fp16, on a CUDA GPU) as torchao's UIntxBitPackedTensor: int4 values packed by gemlite
    for its kernels in the weight's dtype (gemlite.helper.A16Wn), called through F.linear like the int8 path."""
    import gemlite
    from torchao.prototype.quantization.uintx.uintx_bit_packed_tensor import UIntxBitPackedTensor
    values, scale, zero = int4_rounding(weight, group)
    layer = gemlite.helper.A16Wn(device=weight.device, dtype=weight.dtype).from_weights(values, scale, zero, 4, group)
    out_features, in_features = weight.shape
    kwargs = {"in_features": in_features, "out_features": out_features, "packing_bitwidth": None,
              "data_contiguous": layer.data_contiguous, "elements_per_sample": layer.elements_per_sample,
              "W_group_mode": layer.W_group_mode, "meta_args": layer.get_meta_args()}
    packed, scales, zeros = layer.get_tensor_args()
    return UIntxBitPackedTensor(packed, scales, zeros, kwargs, 4, group, weight.dtype)
