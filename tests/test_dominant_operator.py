"""The dominant operator, who launches the kernels, and attention as written in practice (issue 38).

Small planted models profiled here on the CPU cover the rules end to end (tests/planted/, each with fixed=1 for the
expert's fix); hand-built GPU traces cover the ranking against the TF32 finding and the launch counts by phase."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from perflab import RunConfig
from perflab.diagnose import Finding, diagnose
from perflab.diagnose.dominant_operator import group_operators, op_key
from perflab.diagnose.operator_facts import OPERATOR_FACTS, fact_for
from perflab.diagnose.operators import OperatorRow
from perflab.pipeline import profile_run, resolve_config
from perflab.profile.capture import CaptureOptions
from tests.test_diagnose import _x, kernel, launch, steps, write_trace

PLANTED = Path(__file__).parent / "planted"


def _profile(tmp_path, workload: str, with_stack: bool = True, **changes):
    path = workload if "." not in workload else str(PLANTED / workload)
    cfg = resolve_config(RunConfig(workload=path, steps=4, trials=1, warmup=1, **changes), None)
    _, diagnosis, _ = profile_run(cfg.workload, cfg, tmp_path, CaptureOptions(wait=1, warmup=1, active=2,
                                                                              with_stack=with_stack))
    return diagnosis


def _dominant(diagnosis) -> list[Finding]:
    return [f for f in diagnosis.findings if "operator_fact" in f.evidence
            or "share_of_device_time_pct" in f.evidence]


# --- the operator facts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, family", [
    ("aten::upsample_bicubic2d", "bicubic interpolation"), ("UpsampleBicubic2DBackward0", "bicubic interpolation"),
    ("UpsampleBilinear2DBackward0", "bilinear/trilinear interpolation"),
    ("EmbeddingBackward0", "embedding backward"), ("aten::embedding_dense_backward", "embedding backward"),
    ("aten::index_add", "scatter and index accumulation"), ("IndexBackward0", "scatter and index accumulation"),
    ("aten::scatter_add_", "scatter and index accumulation"), ("aten::topk", "topk/kthvalue/unique"),
    ("SortBackward0", "full sort"), ("aten::argsort", "full sort"), ("aten::_unique2", "topk/kthvalue/unique"),
    ("CumsumBackward0", "cumulative scans"), ("GridSampler2DBackward0", "grid sampling"),
    ("aten::nonzero", "data-dependent selection"), ("aten::bincount", "histograms and counts"),
])
def test_operator_facts_cover_forward_ops_and_their_backward_nodes(op, family):
    assert fact_for(op).name == family


@pytest.mark.parametrize("op", ["aten::linear", "aten::add", "AddmmBackward0", "aten::embedding_bag",
                                "aten::softmax", "aten::layer_norm"])
def test_ops_with_no_known_trouble_have_no_fact(op):
    assert fact_for(op) is None


def test_every_fact_says_what_to_do_and_what_the_fix_keeps():
    for fact in OPERATOR_FACTS:
        assert fact.advice and fact.known and fact.replacement
        assert 0 < fact.fix_keeps < 1


def test_a_forward_op_and_its_backward_node_share_one_key():
    assert op_key("aten::upsample_bicubic2d") == op_key("UpsampleBicubic2DBackward0")
    assert op_key("aten::sort") == op_key("SortBackward0")


def _row(op, share, module="blocks.*", line=None, gflop=0.0, bound="unknown", pct=None) -> OperatorRow:
    return OperatorRow(op=op, module=module, line=line, calls_per_step=1.0, ms_per_step=share / 10, share_pct=share,
                       mean_us=100.0, gflop_per_step=gflop, mb_per_step=0.0, dtype="float", achieved_tflops=0.0,
                       achieved_gbps=0.0, intensity_flop_per_byte=None, bound=bound, pct_of_roof=pct)


def test_forward_and_backward_rows_of_one_family_add_up_and_matmuls_are_left_to_the_compute_rules():
    groups = group_operators([_row("aten::linear", 40, gflop=3.0), _row("UpsampleBicubic2DBackward0", 30),
                              _row("aten::upsample_bicubic2d", 9, line="model.py(12): forward"),
                              _row("AddmmBackward0", 15), _row("aten::relu", 5)])
    assert [group.key for group in groups] == ["bicubic interpolation"]
    assert groups[0].share_pct == 39
    assert groups[0].where == ("blocks.*", "model.py(12): forward")


# --- a dominant odd op outranks the TF32 finding (a hand-built GPU trace) ----------------------------------------

def _bicubic_beside_fp32_matmuls(tmp_path, bicubic_us: float, matmul_us: float) -> Path:
    """Steps of an fp32 mm (sgemm, TF32 off) and a bicubic upsample forward and backward, each op's kernel launched
    right away and the kernels back to back (a busy GPU)."""
    length = int(bicubic_us + matmul_us + 30)
    events = steps(2, length)
    corr = 0
    for step in range(2):
        base = step * length
        events += [_x("user_annotation", "forward", base, length // 2),
                   _x("user_annotation", "backward", base + length // 2, length - length // 2)]
        ops = [("aten::mm", matmul_us, "ampere_sgemm_128x64_nn", [[2048, 2048], [2048, 2048]]),
               ("aten::upsample_bicubic2d", bicubic_us / 5, "upsample_bicubic2d_out_frame", [[8, 64, 64, 64]]),
               ("autograd::engine::evaluate_function: UpsampleBicubic2DBackward0", bicubic_us * 4 / 5,
                "upsample_bicubic2d_backward_out_frame", None)]
        t = base + 2
        for name, dur, kernel_name, dims in ops:
            corr += 1
            args = {"External id": 1000 + corr}
            if dims:
                args.update({"Input Dims": dims, "Input type": ["float"] * len(dims)})
            if "bicubic" in name:
                args["Sequence number"] = 7 + step  # the backward node reaches its forward op's module by it
            events += [_x("cpu_op", name, t, 4, **args), launch(t + 1, corr, dur=2),
                       kernel(kernel_name, t + 5, dur, corr, ext=1000 + corr)]
            t += dur + 5
    return write_trace(tmp_path / "t.json", events)


def test_a_dominant_bicubic_upsample_outranks_the_fp32_matmul_finding(tmp_path):
    diagnosis = diagnose(_bicubic_beside_fp32_matmuls(tmp_path, bicubic_us=450, matmul_us=340))
    summaries = [f.summary for f in diagnosis.findings]
    bicubic = next(i for i, s in enumerate(summaries) if s.startswith("bicubic interpolation"))
    fp32 = next(i for i, s in enumerate(summaries) if s.startswith("fp32 matmuls/convs with TF32 off"))
    assert bicubic < fp32
    assert diagnosis.headline.startswith("bicubic interpolation")
    finding = diagnosis.findings[bicubic]
    assert finding.evidence["pct_of_roofline"] is not None and finding.evidence["pct_of_roofline"] < 50
    # the gain is what bilinear would not cost: 70% of the operator's share of the step
    assert finding.expected_gain_pct == pytest.approx(0.7 * finding.evidence["share_of_step_pct"], abs=0.2)


def test_a_small_odd_op_is_no_finding_of_its_own(tmp_path):
    diagnosis = diagnose(_bicubic_beside_fp32_matmuls(tmp_path, bicubic_us=100, matmul_us=800))
    assert not _dominant(diagnosis)
    assert diagnosis.bottleneck == "compute bound"


# --- who launches the kernels (a hand-built GPU trace) ----------------------------------------------------------

def _launches(tmp_path, per_phase: dict[str, int], optimizer_ops: str = "aten::add_") -> Path:
    """Per 1000 µs step: the given number of 2 µs kernels per phase, each launched by its own op, 8 µs apart."""
    events = steps(2, 1000)
    corr = 0
    for step in range(2):
        t = step * 1000
        for phase, count in per_phase.items():
            events.append(_x("user_annotation", phase, t, count * 8))
            if phase == "optimizer":
                events.append(_x("user_annotation", "Optimizer.step#Adam.step", t, count * 8))
            for _ in range(count):
                corr += 1
                name = optimizer_ops if phase == "optimizer" else "aten::mul"
                events += [_x("cpu_op", name, t + 1, 6, **{"External id": corr}), launch(t + 2, corr, dur=3),
                           kernel("void at::native::vectorized_elementwise_kernel<4>", t + 6, 2, corr, ext=corr)]
                t += 8
    return write_trace(tmp_path / "t.json", events)


def test_launches_counted_by_phase_put_the_optimizer_implementation_first_when_it_launches_most(tmp_path):
    diagnosis = diagnose(_launches(tmp_path, {"forward": 20, "backward": 30, "optimizer": 60}))
    assert diagnosis.bottleneck == "launch / framework overhead"
    assert "optimizer: 60 of 110 kernels, Adam(foreach=False)" in diagnosis.headline
    assert diagnosis.evidence["kernels_by_phase_per_step"]["optimizer"] == 60
    assert diagnosis.levers[:2] == ["fused-optimizer", "foreach-optimizer"]
    assert diagnosis.levers.index("cuda-graphs") > 1
    assert "fused=True" in diagnosis.advice[0]


def test_a_fused_optimizer_that_still_launches_most_is_named_but_not_proposed_again(tmp_path):
    diagnosis = diagnose(_launches(tmp_path, {"forward": 20, "backward": 30, "optimizer": 60},
                                   optimizer_ops="aten::_fused_adam_"))
    assert "Adam(fused)" in diagnosis.headline
    assert diagnosis.levers[:2] == ["cuda-graphs", "compile"]


def test_launches_mostly_from_the_model_keep_graphs_and_compile_first(tmp_path):
    diagnosis = diagnose(_launches(tmp_path, {"forward": 50, "backward": 40, "optimizer": 20}))
    assert "forward: 50 of 110 kernels" in diagnosis.headline
    assert diagnosis.levers[:2] == ["cuda-graphs", "compile"]


# --- live CPU runs of the planted cases ----------------------------------------------------------------------

def test_bicubic_upsampling_is_named_with_its_module_line_share_and_the_bilinear_fix(tmp_path):
    diagnosis = _profile(tmp_path, "bicubic_decoder.py", batch_size=8)
    finding = _dominant(diagnosis)[0]
    evidence = finding.evidence
    assert evidence["operator_fact"] == "bicubic interpolation"
    assert set(evidence["ops"]) == {"aten::upsample_bicubic2d", "UpsampleBicubic2DBackward0"}
    assert evidence["module"] == "Decoder"
    assert "bicubic_decoder.py(" in evidence["line"]
    assert evidence["share_of_device_time_pct"] >= 20
    assert "bilinear" in finding.advice[0] and "Decoder" in finding.advice[0]
    # the summary rounds the share it measured; the evidence keeps it to 3 digits (85.46 -> "85%" beside 85.5)
    said = re.search(r"(\d+)% of the CPU op time", finding.summary)
    assert said and abs(int(said.group(1)) - evidence["share_of_device_time_pct"]) <= 0.5 + 0.05
    assert diagnosis.headline == finding.summary


def test_bilinear_upsampling_in_the_fixed_decoder_is_no_bicubic_finding(tmp_path):
    diagnosis = _profile(tmp_path, "bicubic_decoder.py", batch_size=8, workload_options={"fixed": "1"})
    assert not [f for f in _dominant(diagnosis) if f.evidence.get("operator_fact") == "bicubic interpolation"]


def test_a_full_sort_for_the_k_best_is_named_with_topk(tmp_path):
    finding = _dominant(_profile(tmp_path, "sort_topk.py", batch_size=64))[0]
    assert finding.evidence["operator_fact"] == "full sort"
    assert finding.evidence["module"] == "TopScores"
    assert "torch.topk" in finding.advice[0]


def test_topk_in_the_fixed_model_is_not_told_to_use_topk(tmp_path):
    diagnosis = _profile(tmp_path, "sort_topk.py", batch_size=64, workload_options={"fixed": "1"})
    assert not any("torch.topk" in advice for f in _dominant(diagnosis) for advice in f.advice)


def test_embedding_rows_pooled_with_index_add_are_named_with_embedding_bag(tmp_path):
    finding = _dominant(_profile(tmp_path, "index_add_scatter.py", batch_size=8))[0]
    # on one CPU thread the embedding's backward or index_add leads, by a little: both scatter into rows
    assert finding.evidence["operator_fact"] in ("embedding backward", "scatter and index accumulation")
    assert set(finding.evidence["ops"]) & {"aten::index_add", "EmbeddingBackward0"}
    assert "EmbeddingBag" in finding.advice[0]
    assert any("use_deterministic_algorithms" in advice for advice in finding.advice)


def test_hand_written_gqa_with_a_causal_mask_gets_sdpa_with_is_causal_and_enable_gqa(tmp_path):
    diagnosis = _profile(tmp_path, "gqa_attention.py", batch_size=2, workload_options={"size": 64})
    finding = next(f for f in diagnosis.findings if "hand-written attention" in f.summary)
    evidence = finding.evidence
    assert evidence["kv_repeat"] == "aten::repeat_interleave" and evidence["query_heads_per_kv_head"] == 4
    assert evidence["causal_mask_builder"] == "aten::triu" and evidence["mask_applier"] == "aten::masked_fill"
    assert "grouped-query" in finding.summary and "causal mask" in finding.summary
    assert "scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)" in finding.advice[0]
    assert any("torch >= 2.5" in advice for advice in finding.advice)


def test_plain_hand_attention_gets_plain_sdpa(tmp_path):
    diagnosis = _profile(tmp_path, "hand_attention.py", batch_size=2, workload_options={"size": 64})
    finding = next(f for f in diagnosis.findings if "hand-written attention" in f.summary)
    assert "scaled_dot_product_attention(q, k, v)" in finding.advice[0]
    assert finding.evidence["kv_repeat"] is None and not finding.evidence["fp32_softmax"]


def test_the_fixed_gqa_attention_is_no_hand_written_attention(tmp_path):
    diagnosis = _profile(tmp_path, "gqa_attention.py", batch_size=2, workload_options={"size": 64, "fixed": "1"})
    assert not [f for f in diagnosis.findings if "hand-written attention" in f.summary]


def test_adam_over_hundreds_of_small_tensors_counts_the_optimizer_launches_and_puts_foreach_first(tmp_path):
    # 300 tensors here (the planted default is 600): Python stacks of 10,000 ops would cost the test half a minute
    diagnosis = _profile(tmp_path, "many_adam_tensors.py", with_stack=False, batch_size=2,
                         workload_options={"size": 150})
    assert diagnosis.bottleneck == "launch / framework overhead"
    assert "Adam(foreach=False)" in diagnosis.headline and "optimizer: " in diagnosis.headline
    by_phase = diagnosis.evidence["op_calls_by_phase_per_step"]
    assert by_phase["optimizer"] > by_phase["forward"] + by_phase["backward"]
    assert diagnosis.levers[:2] == ["fused-optimizer", "foreach-optimizer"]


def test_a_plain_mlp_has_no_dominant_operator(tmp_path):
    assert not _dominant(_profile(tmp_path, "mlp", batch_size=32))
