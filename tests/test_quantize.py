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


def test_int8_weight_llama_tiny_trained_keeps_the_greedy_tokens_of_its_fp32_reference_through_the_gate(tmp_path):
    # trained on the synthetic language, the reference is confident, so the gate's agreement means something:
    # int8's per-row rounding (about 1% of a weight) changes no greedy token (measured: 100%, logits error 4e-3)
    import json
    from perflab.cli import main
    out = tmp_path / "int8"
    assert main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=llama-tiny", "--option",
                 "weights=trained", "--option", "prompt_len=8-12", "--option", "output_len=8", "--quantize",
                 "int8-weight", "--quality-steps", "2", "--steps", "1", "--warmup", "1", "--trials", "1",
                 "--device", "cpu", "--out", str(out)]) == 0
    quality = json.loads((out / "result.json").read_text())["quality"]
    assert quality["verdict"] == "pass", quality["reason"]
    assert quality["metrics"]["baseline_confident_share"] >= 0.5
    assert quality["metrics"]["greedy_agreement"] >= 0.95 and quality["metrics"]["rel_error"] < 2e-2


def test_random_weights_are_too_flat_to_judge_and_trained_ones_are_not():
    from perflab.models.decoder import SIZES, Decoder
    from perflab.models.language import SyntheticLanguage, train_decoder
    from perflab.quality.generation import MIN_CONFIDENT_SHARE, baseline_confidence
    size = SIZES["llama-tiny"]
    tokens = SyntheticLanguage(size.vocab).sample(2, 24, seed=5)
    torch.manual_seed(0)
    random_model = Decoder(size).eval()
    trained = train_decoder(size, seed=1, device=torch.device("cpu"), steps=80).eval()
    with torch.no_grad():
        _, random_share = baseline_confidence([random_model(tokens)])
        _, trained_share = baseline_confidence([trained(tokens)[:, 2:]])  # from the third token the language is learnable
    assert random_share < MIN_CONFIDENT_SHARE <= trained_share


def test_quantizing_a_copy_leaves_the_reference_model_untouched():
    from perflab.models.decoder import SIZES, Decoder
    torch.manual_seed(0)
    model = Decoder(SIZES["llama-tiny"]).eval()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    quantized = quantize_weights(copy.deepcopy(model), "int8-weight")
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    # every projection quantized, the output head included (as gpt-fast does); the embedding table stays
    linears = [m for m in quantized.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m.weight, torchao.quantization.Int8Tensor) for m in linears)
    assert quantized.head in linears and not isinstance(quantized.token_embedding.weight, torchao.quantization.Int8Tensor)


def test_torchao_decode_tuning_is_the_inductor_config_torchao_recommends_for_its_quantized_models():
    import torch._inductor.config as inductor_config
    from torchao.quantization.utils import recommended_inductor_config_setter
    from perflab.workloads.generation import DECODE_TUNINGS
    saved = inductor_config.save_config()
    try:
        before = inductor_config.get_config_copy()
        recommended_inductor_config_setter()
        after = inductor_config.get_config_copy()
    finally:
        inductor_config.load_config(saved)
    changed = {key for key in after if after[key] != before[key]}
    tuning = DECODE_TUNINGS["torchao"]
    assert changed and changed <= set(tuning) and all(after[key] == value for key, value in tuning.items())



def test_int4_rounding_for_gemlite_is_per_group_in_the_weights_dtype_within_half_a_step():
    # gemlite's kernel multiplies by the stored (bf16) scale and zero: the rounding must be against those, so every
    # weight comes back within half a step (plus the clamp at a group's ends), and the values fill 0..15
    from perflab.generation.quantize import int4_rounding
    torch.manual_seed(0)
    weight = (torch.randn(64, 256) * 0.02).bfloat16()
    values, scale, zero = int4_rounding(weight, 128)
    assert values.dtype == torch.uint8 and int(values.min()) == 0 and int(values.max()) == 15
    assert scale.dtype == zero.dtype == torch.bfloat16 and scale.shape == zero.shape == (64, 2)
    groups = (values.float().view(64, 2, 128) - zero.float()[..., None]) * scale.float()[..., None]
    steps = (groups.view(64, 256) - weight.float()).abs() / scale.float().repeat_interleave(128, dim=1)
    assert float(steps.max()) < 0.55 and float(steps.mean()) < 0.3


def test_int4_through_gemlite_refuses_a_layer_whose_inputs_do_not_split_into_groups():
    from perflab.errors import PerflabError
    from perflab.generation.quantize import GEMLITE, quantize_weights
    from perflab.models.decoder import SIZES, Decoder
    model = Decoder(SIZES["llama-tiny"])  # dim 64: not a multiple of 128
    with pytest.raises(PerflabError, match=r"groups of 128 input features; .* has 64 .*--quantize-kernel torchao"):
        quantize_weights(model, "int4-weight", GEMLITE)
