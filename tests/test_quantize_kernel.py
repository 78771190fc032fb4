"""--quantize-kernel: which kernel each quantized scheme runs through, decided without torchao or a GPU."""
import subprocess
import sys

import pytest
import torch

from perflab import RunConfig
from perflab.errors import PerflabError
from perflab.generation import quantize
from perflab.generation.quantize import GEMLITE, _release, gemlite_missing, resolved_kernel, scheme_refusal

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture
def gemlite_05(monkeypatch):
    """gemlite 0.5.1.post1 'installed' (the version torchao 0.18's gemlite path calls), and torchao's config found."""
    monkeypatch.setattr(quantize.importlib.util, "find_spec", lambda name: object() if name == "gemlite" else None)
    monkeypatch.setattr(quantize.importlib.metadata, "version", lambda name: "0.5.1.post1")
    monkeypatch.setitem(sys.modules, "torchao.prototype.quantization.quant_api",
                        type(sys)("quant_api_stub"))
    sys.modules["torchao.prototype.quantization.quant_api"].UIntxWeightOnlyConfig = object


def test_versions_compare_by_their_release_numbers():
    assert _release("0.5.1.post1") == (0, 5, 1) and _release("0.6.0") == (0, 6, 0) and _release("1.0rc1") == (1, 0)


def test_auto_takes_gemlite_for_int8_where_it_runs_int4_only_when_asked_and_torchao_elsewhere(gemlite_05):
    assert resolved_kernel("int8-weight", "auto", CUDA) == (GEMLITE, "auto: gemlite is installed and takes this scheme")
    kernel, why = resolved_kernel("int4-weight", "auto", CUDA)  # its gate failed on the GPU: only when asked for
    assert kernel == "torchao" and "gemlite only when asked for" in why and "NaN" in why
    assert resolved_kernel("int4-weight", GEMLITE, CUDA) == (GEMLITE, "asked for (--quantize-kernel gemlite)")
    kernel, why = resolved_kernel("fp8", "auto", CUDA)
    assert kernel == "torchao" and "take int8-weight, int4-weight here, not fp8" in why
    kernel, why = resolved_kernel("int8-weight", "auto", CPU)
    assert kernel == "torchao" and "Triton kernels for a CUDA GPU" in why
    assert resolved_kernel("int8-weight", "torchao", CUDA)[0] == "torchao"


def test_auto_falls_back_and_an_explicit_gemlite_is_refused_with_the_install_line(monkeypatch):
    monkeypatch.setattr(quantize.importlib.util, "find_spec", lambda name: None)
    kernel, why = resolved_kernel("int8-weight", "auto", CUDA)
    assert kernel == "torchao" and "pip install 'perflab[quant]' (gemlite < 0.6" in why
    with pytest.raises(PerflabError, match=r"--quantize-kernel gemlite refused: gemlite is not importable"):
        resolved_kernel("int8-weight", GEMLITE, CUDA)


def test_a_gemlite_whose_api_torchao_does_not_call_is_named_with_its_version(gemlite_05, monkeypatch):
    monkeypatch.setattr(quantize.importlib.metadata, "version", lambda name: "0.6.0.post2")
    assert "gemlite 0.6.0.post2 changed the API" in gemlite_missing("int8-weight", CUDA)
    assert scheme_refusal("int8-weight", CUDA, "bf16", GEMLITE).startswith("--quantize-kernel gemlite: gemlite 0.6")


def test_the_kernel_option_needs_a_scheme_and_takes_only_its_choices():
    with pytest.raises(PerflabError, match=r"--quantize-kernel gemlite refused: .*add --quantize int8-weight"):
        RunConfig(workload="generate", mode="infer", quantize_kernel="gemlite").validate()
    with pytest.raises(PerflabError, match="--quantize-kernel"):
        RunConfig(workload="generate", mode="infer", quantize="int8-weight", quantize_kernel="marlin").validate()
    RunConfig(workload="generate", mode="infer", quantize="int8-weight", quantize_kernel="gemlite").validate()


def test_the_cli_refuses_a_kernel_without_a_scheme_in_one_line():
    done = subprocess.run([sys.executable, "-m", "perflab", "run", "--workload", "generate", "--mode", "infer",
                           "--quantize-kernel", "gemlite", "--device", "cpu"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--quantize-kernel gemlite refused" in done.stderr + done.stdout


def test_int4_through_gemlite_leaves_layers_its_unmasked_gemv_would_overrun_to_tinygemm():
    # gemlite 0.5's 4-bit GEMV works in blocks of up to 512 outputs with no bounds mask: Llama-3's output head
    # (128,256 outputs) goes to tinygemm, every other llama-8b projection (multiples of 1024) to gemlite
    from perflab.generation.quantize import GEMLITE_INT4_OUTPUT_MULTIPLE, int4_layers_by_kernel, kernel_note
    from perflab.models.decoder import SIZES, Decoder
    with torch.device("meta"):
        model = Decoder(SIZES["llama-8b"])
    through_gemlite, through_tinygemm = int4_layers_by_kernel(model)
    assert through_tinygemm == [model.head] and model.head.out_features == 128256
    assert through_gemlite and all(m.out_features % GEMLITE_INT4_OUTPUT_MULTIPLE == 0 for m in through_gemlite)
    note = kernel_note(model, "int4-weight", GEMLITE)
    assert note.startswith("1 layer(s) through tinygemm instead of gemlite") and "head (128,256 outputs)" in note
    assert kernel_note(model, "int8-weight", GEMLITE) is None and kernel_note(model, "int4-weight", "torchao") is None
