"""Weight quantization through torchao (perflab/generation/quantize.py) on a CPU: the configs perflab asks for, and
the quantized decoder's greedy tokens against its reference. Skipped where torchao is not installed."""
import copy

import pytest
import torch

torchao = pytest.importorskip("torchao")

from perflab.generation.quantize import INT4_KERNEL_FORMAT, quantization_config, quantize_weights  # noqa: E402


def test_every_scheme_asks_torchao_to_leave_inductor_alone_and_int4_takes_tinygemms_layout():
    # torchao's default (set_inductor_config=True) switches coordinate descent tuning on for the whole process when
    # quantizing; int4 used to be built without the switch, so `--quantize int4-weight` changed every later compile
    for scheme in ("int8-weight", "int4-weight", "fp8"):
        assert quantization_config(scheme).set_inductor_config is False, scheme
    int4 = quantization_config("int4-weight")
    assert int4.group_size == 128 and int4.int4_packing_format == INT4_KERNEL_FORMAT
