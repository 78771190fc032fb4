"""The decode step: no host sync per token, one graph without breaks or recompiles, gpt-fast's Inductor settings
scoped to the compiled step, and the compiled path's outputs equal to eager decoding."""
import pytest
import torch

from perflab.config import RunConfig
from perflab.workloads.generation import GPT_FAST_OPTIONS
from perflab.generation.compiled_decode import (compile_decode, decode_attention,
                                                inductor_options)
from perflab.generation.decode import generate_greedy, teacher_forced_logits
from perflab.models.decoder import SIZES, Decoder
from perflab.generation.session import open_session
from perflab.generation.speculative import generate_speculative
from perflab.results.metrics import Generation

CPU = torch.device("cpu")
SYNC_OP = "aten::_local_scalar_dense"  # under .item(), .tolist(), int(tensor), bool(tensor): a read to the host


def tiny_decoder(seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(SIZES["tiny"]).eval()


def host_syncs(run) -> int:
    """How many times `run` read a tensor's value back to the host (what blocks on a GPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        run()
    return sum(event.count for event in profiler.key_averages() if event.key == SYNC_OP)


def eager_backend_session(model, static=True, batch=1, positions=48, largest_compiled=1):
    """A session whose decode step goes through Dynamo (fullgraph) with the eager backend: what Dynamo captures,
    without the minutes Inductor's C++ compile takes on a CPU."""
    session = open_session(model, batch, positions, CPU, torch.float32, static=static)
    session.compiled = torch.compile(session._step, backend="eager", fullgraph=True, dynamic=False)
    session.largest_compiled = largest_compiled
    return session


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_greedy_decode_reads_nothing_back_to_the_host_per_token(static):
    model = tiny_decoder()
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    session = open_session(model, 1, 40, CPU, torch.float32, static=static)
    with torch.inference_mode():
        generate_greedy(session, prompt, 2)  # first use out of the count
        assert host_syncs(lambda: generate_greedy(session, prompt, 24)) == 0


def test_speculative_decoding_syncs_once_per_round_not_per_token():
    target, draft = tiny_decoder(0), tiny_decoder(1)
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    sessions = [open_session(model, 1, 40, CPU, torch.float32, static=True) for model in (target, draft)]
    from perflab.generation.speculative import SpeculativeStats
    stats = SpeculativeStats()
    with torch.inference_mode():
        syncs = host_syncs(lambda: generate_speculative(*sessions, prompt, 20, 3, stats))
    assert stats.rounds > 0 and syncs == stats.rounds


def test_compiled_decode_step_is_one_graph_without_breaks():
    model = tiny_decoder()
    session = open_session(model, 1, 32, CPU, torch.float32, static=True)
    with torch.inference_mode():
        session.start(torch.zeros(1, 4, dtype=torch.long))
        explained = torch._dynamo.explain(session._step)(torch.zeros(1, 1, dtype=torch.long), torch.tensor([4]))
    torch._dynamo.reset()
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_compiled_decode_never_recompiles_across_tokens_requests_and_the_gate_path():
    model = tiny_decoder()
    prompts = [torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(length))
               for length in (6, 9)]
    session = eager_backend_session(model)
    try:
        with torch.inference_mode():
            tokens = generate_greedy(session, prompts[0], 3)  # compiles the one-token step once
            with torch._dynamo.config.patch(error_on_recompile=True):
                for prompt in prompts:
                    tokens = generate_greedy(session, prompt, 12)
                    teacher_forced_logits(session, prompt, tokens)  # the quality gate's way through the step
    finally:
        session.close()


def test_compiled_decode_gives_eager_decodings_tokens_and_speculative_stays_identical():
    target, draft = tiny_decoder(0), tiny_decoder(1)
    prompt = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = generate_greedy(open_session(target, 2, 40, CPU, torch.float32, static=True), prompt, 16)
        compiled = eager_backend_session(target, batch=2, largest_compiled=4)
        assert torch.equal(generate_greedy(compiled, prompt, 16), expected)
        speculative = generate_speculative(compiled, eager_backend_session(draft, batch=2), prompt, 16, 3)
    torch._dynamo.reset()
    assert torch.equal(speculative, expected)


def test_decode_tuning_adds_gpt_fast_inductor_settings_to_the_mode_without_touching_global_config():
    import torch._inductor.config as inductor_config
    before = inductor_config.coordinate_descent_tuning
    tuned = inductor_options("reduce-overhead", "gpt-fast")
    assert tuned["triton.cudagraphs"] is True and tuned["coordinate_descent_tuning"] is True
    assert set(GPT_FAST_OPTIONS) <= set(tuned) and "max_autotune_pointwise" not in tuned
    assert inductor_options("reduce-overhead", "autotune")["max_autotune_pointwise"] is True
    assert inductor_options("reduce-overhead", "off") == {"triton.cudagraphs": True}
    session = open_session(tiny_decoder(), 1, 16, CPU, torch.float32, static=True, compile_mode="reduce-overhead",
                           tuning="gpt-fast")
    assert session.compile_settings["inductor_options"] == tuned
    assert session.compile_settings["decode_sdpa"].startswith("math")
    session.close()
    assert inductor_config.coordinate_descent_tuning == before


@pytest.mark.parametrize("quantize", [None, "int8-weight"])
def test_the_workload_leaves_the_tuning_to_the_weights_kernel_unless_one_is_named(quantize):
    from perflab.config import RunConfig
    from perflab.workloads.generate import build
    workload = build(RunConfig(workload="generate", mode="infer", device="cpu", quantize=quantize))
    assert workload.generation.decode_tuning is None
    named = build(RunConfig(workload="generate", mode="infer", device="cpu", quantize=quantize,
                            workload_options={"decode_tuning": "autotune"}))
    assert named.generation.decode_tuning == "autotune"


def test_inductors_own_quantized_products_get_gpt_fast_settings_and_every_other_kernel_cublas_defaults():
    # gemlite's kernels are opaque to Inductor: its coordinate descent would tune only the small kernels around them
    from perflab.workloads.generation import default_decode_tuning
    assert default_decode_tuning(products_by_inductor=True) == "gpt-fast"
    assert default_decode_tuning(products_by_inductor=False) == "off"


def test_a_decode_step_compiled_without_inductors_graphs_drops_only_their_option():
    options = inductor_options("reduce-overhead", "gpt-fast", inductor_graphs=False)
    assert "triton.cudagraphs" not in options and options["coordinate_descent_tuning"] is True
    compiled, used = compile_decode(lambda x: x + 1, "reduce-overhead", "off", inductor_graphs=False)
    assert used == {} and callable(compiled)


def test_decode_attention_is_math_only_when_tuned_and_no_backend_is_pinned():
    assert decode_attention("gpt-fast", "auto")[1].startswith("math")
    assert decode_attention("autotune", "auto")[1].startswith("math")
    assert decode_attention("off", "auto")[1].startswith("auto")
    assert decode_attention("gpt-fast", "efficient")[1] == "efficient"


def test_a_compiled_decode_whose_host_needs_the_whole_step_to_issue_it_is_host_bound():
    from perflab.diagnose.decode import classify_decode
    from perflab.bottlenecks import LAUNCH_OVERHEAD, MEMORY_BANDWIDTH

    def metrics(host_ms):
        bound = {"pct_of_bound": 27.0, "measured_ms_per_token": 2.8, "bound_ms_per_token": 0.75,
                 "measured_over_bound": 3.7, "memory_gbps": 2900.0, "memory_gbps_source": "test",
                 "host_issue_ms_per_token": host_ms}
        return Generation.from_dict({"bandwidth_bound": bound})
    config = RunConfig(batch_size=1, compile="reduce-overhead", device="cuda")
    host_bound = classify_decode(metrics(2.7), config, None)
    assert host_bound.cls == LAUNCH_OVERHEAD and "host-bound" in host_bound.summary
    assert host_bound.evidence["host_issue_ms_per_token"] == 2.7
    assert "host-bound" not in classify_decode(metrics(0.3), config, None).summary
    assert classify_decode(metrics(0.3), config, None).cls in (LAUNCH_OVERHEAD, MEMORY_BANDWIDTH)


def test_a_graph_replayed_decode_far_below_the_bound_is_kernel_efficiency_not_launching():
    from perflab.diagnose.decode import classify_decode
    from perflab.bottlenecks import LAUNCH_OVERHEAD, MEMORY_BANDWIDTH
    # the H100's int8-weight 1b decode with perflab's graphs (2026-11-23): 1.31 ms per step, 28% of the bound
    bound = {"pct_of_bound": 28.3, "measured_ms_per_token": 1.314, "bound_ms_per_token": 0.372,
             "measured_over_bound": 3.53, "memory_gbps": 2972.0, "memory_gbps_source": "calibrated",
             "host_issue_ms_per_token": 0.62, "achieved_gbps": 842.0}
    config = RunConfig(batch_size=1, compile="reduce-overhead", device="cuda")
    graphed = {"bandwidth_bound": bound, "decode_compile": {"graphs": "perflab", "captured_lengths": [1]}}
    finding = classify_decode(Generation.from_dict(graphed), config, None)
    assert finding.cls == MEMORY_BANDWIDTH and "kernel efficiency" in finding.summary and "842 GB/s" in finding.summary
    skipped = {"bandwidth_bound": bound, "decode_compile": {"graphs": "inductor", "cudagraph_skips": 2}}
    # graphs were skipped: launches remain
    assert classify_decode(Generation.from_dict(skipped), config, None).cls == LAUNCH_OVERHEAD


def test_device_wait_not_the_hosts_issue_clock_decides_host_bound_when_recorded():
    from perflab.diagnose.decode import classify_decode
    from perflab.generation.metrics import RequestTiming, device_wait_ms_per_token
    # outputs at 1, 3, 5 ms; the device started steps 2 and 3 at 1.1 and 4.5 ms: it idled 0.1 + 1.5 ms for 2 tokens
    request = RequestTiming(1, 8, [1.0, 3.0, 5.0], [1, 1, 1], started_ms=[1.1, 4.5])
    assert device_wait_ms_per_token([request]) == pytest.approx(0.8)
    assert device_wait_ms_per_token([RequestTiming(1, 8, [1.0, 3.0], [1, 1])]) is None
    config = RunConfig(batch_size=1, compile="reduce-overhead", device="cuda")

    def regime(wait_ms, host_ms=1.2):  # the host's issue clock at 80% of the step: a full launch queue reads so
        bound = {"pct_of_bound": 40.0, "measured_ms_per_token": 1.5, "bound_ms_per_token": 0.6,
                 "measured_over_bound": 2.5, "memory_gbps": 2900.0, "memory_gbps_source": "test",
                 "host_issue_ms_per_token": host_ms, "device_wait_ms_per_token": wait_ms}
        return classify_decode(Generation.from_dict({"bandwidth_bound": bound}), config, None).summary
    assert "host-bound" in regime(0.6) and "waits 0.6 ms per token" in regime(0.6)
    assert "host-bound" not in regime(0.01)
    # guards inside the step's call: the device's clock counts them as the step, the host's issue clock fills it
    assert "host-bound" in regime(0.01, host_ms=1.5) and "host needs 1.5 ms" in regime(0.01, host_ms=1.5)


def test_token_clock_marks_where_each_decode_step_started():
    from perflab.generation.metrics import TokenClock
    clock = TokenClock(CPU)
    session = open_session(tiny_decoder(), 1, 40, CPU, torch.float32, static=True)
    with torch.inference_mode():
        generate_greedy(session, torch.zeros(1, 6, dtype=torch.long), 10, clock)
    (request,) = clock.timings()
    assert len(request.started_ms) == len(request.emitted_ms) - 1
    assert all(before <= start <= after for before, start, after
               in zip(request.emitted_ms, request.started_ms, request.emitted_ms[1:]))


def test_token_clock_reports_how_long_the_host_took_to_issue_each_decode_token():
    from perflab.generation.metrics import TokenClock
    clock = TokenClock(CPU)
    model = tiny_decoder()
    session = open_session(model, 1, 40, CPU, torch.float32, static=True)
    with torch.inference_mode():
        generate_greedy(session, torch.zeros(1, 6, dtype=torch.long), 10, clock)
    (request,) = clock.timings()
    assert len(request.issued_ms) == 10 and request.issued_ms == sorted(request.issued_ms)
    assert request.issued_ms[-1] > request.issued_ms[0] > 0


def test_int8_weight_asks_torchao_not_to_change_inductor_for_the_whole_process(monkeypatch):
    import sys
    import types
    from perflab.generation.quantize import quantization_config

    class Int8WeightOnlyConfig:  # the shape of torchao >= 0.10's config
        def __init__(self, set_inductor_config=True):
            self.set_inductor_config = set_inductor_config
    quantization = types.ModuleType("torchao.quantization")
    quantization.Int8WeightOnlyConfig = Int8WeightOnlyConfig
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.quantization", quantization)
    assert quantization_config("int8-weight").set_inductor_config is False


@pytest.mark.slow  # Inductor compiles C++ for the step: about half a minute on a small CPU
def test_inductor_compiled_decode_with_gpt_fast_settings_gives_eager_tokens_and_leaves_inductor_config_alone():
    import torch._inductor.config as inductor_config
    before = (inductor_config.coordinate_descent_tuning, inductor_config.triton.unique_kernel_names)
    model = tiny_decoder()
    prompt = torch.randint(0, 512, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = generate_greedy(open_session(model, 1, 40, CPU, torch.float32, static=True), prompt, 12)
        session = open_session(model, 1, 40, CPU, torch.float32, static=True, compile_mode="reduce-overhead")
        try:
            assert torch.equal(generate_greedy(session, prompt, 12), expected)
        finally:
            session.close()
    assert (inductor_config.coordinate_descent_tuning, inductor_config.triton.unique_kernel_names) == before


def cuda_run(tmp_path, name, *levers):
    from perflab.cli import main
    import json
    out = tmp_path / name
    assert main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=tiny", "--option",
                 "prompt_len=8", "--option", "output_len=16", "--steps", "2", "--warmup", "2", "--trials", "2",
                 "--quality-steps", "1", "--device", "cuda", "--precision", "bf16", "--kv-cache", "static",
                 "--compile", "reduce-overhead", *levers, "--out", str(out)]) == 0
    return json.loads((out / "result.json").read_text())


@pytest.mark.cuda
@pytest.mark.parametrize("graphs", ["perflab", "inductor"])
def test_compiled_decode_replays_as_cuda_graphs_on_a_gpu(tmp_path, graphs):
    data = cuda_run(tmp_path, "bf16", "--option", f"decode_graphs={graphs}")
    compiled = data["metrics"]["generation"]["decode_compile"]
    # plain weights: cuBLAS multiplies the matrices (decode_tuning=off, the default), no coordinate descent
    assert compiled["decode_tuning"] == "off" and compiled["graphs"] == graphs
    assert "coordinate_descent_tuning" not in compiled["inductor_options"]
    if graphs == "perflab":  # Inductor compiles without its own graphs; perflab captured the one-token step
        assert "triton.cudagraphs" not in compiled["inductor_options"] and compiled["captured_lengths"] == [1]
    else:
        assert compiled["cudagraph_skips"] == 0
    assert data["quality"]["verdict"] == "pass"


@pytest.mark.cuda
def test_int8_weight_compiled_decode_replays_as_cuda_graphs_on_a_gpu(tmp_path):
    pytest.importorskip("torchao")
    data = cuda_run(tmp_path, "int8", "--quantize", "int8-weight")
    compiled = data["metrics"]["generation"]["decode_compile"]
    # quantized weights: gpt-fast's settings by default, so the int8 dequantisation fuses into the product
    assert compiled["decode_tuning"] == "gpt-fast" and compiled["inductor_options"]["coordinate_descent_tuning"]
    assert compiled["captured_lengths"] == [1]
    assert data["quality"]["verdict"] == "pass"


@pytest.mark.cuda
def test_captured_decode_gives_eager_greedy_tokens_and_speculative_output_on_a_gpu():
    gpu = torch.device("cuda")
    target, draft = tiny_decoder(0).to(gpu), tiny_decoder(1).to(gpu)
    prompts = [torch.randint(0, 512, (1, length), generator=torch.Generator().manual_seed(length)).to(gpu)
               for length in (6, 9)]
    eager = open_session(target, 1, 48, gpu, torch.float32, static=True)
    captured = open_session(target, 1, 48, gpu, torch.float32, static=True, compile_mode="reduce-overhead",
                            largest_compiled=4)
    draft_session = open_session(draft, 1, 48, gpu, torch.float32, static=True, compile_mode="reduce-overhead")
    try:
        with torch.inference_mode():
            for prompt in prompts:  # a second request replays the graph captured during the first
                expected = generate_greedy(eager, prompt, 20)
                assert torch.equal(generate_greedy(captured, prompt, 20), expected)
                # K=3: the target verifies 4 tokens at a time (a second graph) and rolls back rejected drafts
                assert torch.equal(generate_speculative(captured, draft_session, prompt, 20, 3), expected)
        assert captured.captured.lengths == [1, 4] and draft_session.captured.lengths == [1]
        assert captured.compile_settings["graphs"] == "perflab"
    finally:
        for session in (eager, captured, draft_session):
            session.close()


def test_an_unknown_decode_tuning_exits_2_naming_the_choices(capsys):
    from perflab.cli import main
    assert main(["run", "--workload", "generate", "--mode", "infer", "--option", "size=tiny",
                 "--option", "decode_tuning=fast"]) == 2
    assert "decode_tuning must be one of gpt-fast, autotune, torchao, mm-templates, off" in capsys.readouterr().err


def test_every_decode_tuning_names_only_settings_this_inductor_knows():
    # compiled_decode.inductor_options drops unknown keys (for older torch): here none may be dropped silently
    from perflab.generation.compiled_decode import inductor_options
    from perflab.workloads.generation import DECODE_TUNINGS
    for name, tuning in DECODE_TUNINGS.items():
        options = inductor_options("reduce-overhead", name, inductor_graphs=False)
        assert tuning.items() <= options.items() and "triton.cudagraphs" not in options, name
