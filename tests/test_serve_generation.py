"""perflab serve with a generation workload: requests arrive by the scenario, a batch of them is prefilled together
and decoded to completion (static batching), and each query's TTFT counts from its scheduled arrival."""
import numpy as np
import pytest
import torch

from perflab.cli import main
from perflab.config import RunConfig
from perflab.generation.decode import generate_greedy
from perflab.levers.plan import build_plan
from perflab.results import Result
from perflab.serve.generation import GenerationEngine, load_requests
from perflab.serve.loadgen import run_offline, run_scheduled
from perflab.serve.metrics import per_query_requests, summarize_tokens
from perflab.serve.schedule import poisson_arrivals, sample_order
from perflab.serve.server import Server
from perflab.workloads import load_workload

MAX_BATCH = 4
TINY = ["serve", "--workload", "generate", "--option", "size=tiny", "--option", "output_len=8", "--device", "cpu",
        "--warmup", "1", "--batcher-max-batch", str(MAX_BATCH)]


def tiny_engine(**levers):
    cfg = RunConfig(workload="generate", device="cpu", mode="infer", batch_size=MAX_BATCH, warmup=1,
                    workload_options={"size": "tiny", "output_len": "8"}, **levers)
    workload = load_workload("generate", cfg)
    plan = build_plan(workload, cfg, torch.device("cpu"))
    pool = load_requests(workload, 16, plan.device)
    served = {}
    engine = GenerationEngine(plan, pool, MAX_BATCH,
                              on_results=lambda ids, tokens: served.setdefault(len(served), (ids.copy(), tokens.clone())))
    return plan, pool, engine, served


def test_warm_up_prefills_every_prompt_length_in_the_pool_before_the_load():
    plan, pool, engine, served = tiny_engine()
    session = engine.step.target
    prefilled = []
    start = session.start
    session.start = lambda prompt: prefilled.append(prompt.shape[1]) or start(prompt)
    assert len(set(pool.prompt_len)) > 1, "the tiny requests were meant to vary in length"
    engine.warm_up(1)
    assert set(prefilled) == set(pool.prompt_len)
    assert engine.take_host_times() is None, "warm-up time is not counted as serving"


def test_ttft_counts_from_the_scheduled_arrival_so_the_queue_wait_is_in_it():
    plan, pool, engine, served = tiny_engine()
    server = Server([engine], plan.stepping)
    try:
        server.warm_up(1)
        served.clear()
        # far faster than one instance generates (40 queries in about 13 ms; a batch takes milliseconds even on a
        # fast machine): queries queue behind running batches
        arrivals = poisson_arrivals(3000.0, 0.01, 40, seed=3)
        log = run_scheduled(server, arrivals, sample_order(len(arrivals), pool.count, seed=0), MAX_BATCH, 0.002)
    finally:
        server.close()
    assert log.completed.all()
    seen = []
    for ids, request, last_token_s in log.token_batches:
        for query, timing in zip(ids, per_query_requests(ids, request, last_token_s, log.scheduled_s)):
            seen.append(query)
            waited_ms = 1000 * (log.formation_s[query] - log.scheduled_s[query])  # queue wait
            on_device_ms = 1000 * (log.copied_in_s[query] - log.scheduled_s[query])
            assert timing.ttft_ms >= on_device_ms >= waited_ms
            assert timing.emitted_ms[-1] <= 1000 * (log.done_s[query] - log.scheduled_s[query]) + 1e-6
            assert timing.output_tokens == 8 and len(timing.emitted_ms) == 8
    assert sorted(seen) == list(range(len(arrivals))), "every query's tokens are accounted once"
    queue_ms = 1000 * (log.formation_s - log.scheduled_s)
    assert queue_ms.max() > 5.0, f"the load was meant to queue (longest wait {queue_ms.max():.1f} ms)"
    summary = summarize_tokens(log, float(np.nanmax(log.done_s)), {"ttft": 1e6, "tpot": 1e6})
    assert summary["requests"] == len(arrivals) and summary["output_tokens"] == 8 * len(arrivals)
    assert summary["output_tokens_per_s"] == pytest.approx(8 * len(arrivals) / np.nanmax(log.done_s))
    assert summary["ttft_ms"]["max"] >= queue_ms.max()
    assert summary["goodput"]["requests_meeting_slo_pct"] == 100.0
    assert summarize_tokens(log, 1.0, {"ttft": 1e-3})["goodput"]["goodput_requests_per_s"] == 0.0


def test_each_query_gets_the_greedy_continuation_of_its_own_prompt():
    plan, pool, engine, served = tiny_engine()
    with plan.stepping():
        for ids in (np.array([2]), np.array([5, 6, 9]), np.array([1, 0, 3, 4])):
            engine.serve(ids)
        for ids, tokens in served.values():
            length = pool.prompt_len[int(ids[0])]  # a batch takes its first request's prompt length
            for row, sample in enumerate(ids):
                alone = generate_greedy(engine.step.target, pool.prompts[sample:sample + 1, :length], 8)
                assert torch.equal(tokens[row], alone[0]), f"query {row} of batch {ids.tolist()}"


def test_a_static_cache_pads_batches_to_max_batch_and_counts_the_padding():
    plan, pool, engine, served = tiny_engine(kv_cache="static")
    assert engine.sizes == [MAX_BATCH]
    with plan.stepping():
        engine.serve(np.array([3, 7]))
        engine.serve(np.array([1, 2, 3, 4]))
    assert engine.padded_samples == 2
    assert [tuple(tokens.shape) for _, tokens in served.values()] == [(2, 8), (4, 8)], "padding is not handed back"


def test_serve_generate_reports_ttft_tpot_tokens_and_goodput_per_point(tmp_path, capsys):
    out = tmp_path / "gen"
    assert main(TINY + ["--qps", "30", "--duration", "0.6", "--min-queries", "16", "--slo", "ttft:500,tpot:100",
                        "--out", str(out)]) == 0
    result = Result.load(out)
    point = result.metrics.serve.points[0]
    gen = point.generation
    assert gen["requests"] == point.completed == point.queries
    assert gen["output_tokens"] == 8 * gen["requests"]
    assert gen["output_tokens_per_s"] == pytest.approx(gen["output_tokens"] / point.duration_s)
    assert gen["goodput"]["goodput_requests_per_s"] == pytest.approx(
        gen["goodput"]["requests_meeting_slo_pct"] / 100 * gen["requests_per_s"])
    assert gen["ttft_ms"]["p50"] <= gen["e2e_latency_ms"]["p50"]
    # the last token comes out before the request is on the host (the point's latency is nearest-rank, the token
    # figures interpolate as perflab run's do: compare the largest, which both read off one real query)
    assert gen["e2e_latency_ms"]["max"] <= point.latency_ms["max"] + 1e-6
    # the engine's host time per batch: issuing (on a CPU, computing) is most of a query's compute time
    host = gen["engine_host_ms_per_batch"]
    assert set(host) == {"issue", "device_wait", "bookkeeping"} and host["device_wait"] == 0.0
    assert 0 < host["issue"] <= point.time_ms["mean"]["compute"] + point.time_ms["mean"]["copy_in"] + 1.0
    assert any("static batching" in note for note in result.notes)
    assert result.config.slo == "ttft:500,tpot:100"
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "goodput" in printed


def test_offline_generation_takes_full_batches(tmp_path):
    plan, pool, engine, served = tiny_engine()
    server = Server([engine], plan.stepping)
    try:
        log = run_offline(server, 12, sample_order(12, pool.count, seed=1), MAX_BATCH, 0.002)
    finally:
        server.close()
    assert log.batch_sizes == [4, 4, 4] and len(log.query_requests()) == 12


def test_generation_with_several_instances_is_refused_in_one_line(tmp_path, capsys):
    assert main(TINY + ["--instances", "2", "--qps", "100", "--min-queries", "16", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "one instance" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
