"""The human summary of a result, as rich tables."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

from perflab.environment import describe_device
from perflab.step.phases import phase_sort_key
from perflab.stats import interval_text
from perflab.results.metrics import Generation, Latency, Metrics
from perflab.results import Result
from perflab.results.kind import run_kind


def fmt(value: Optional[float], digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def memory_row(metrics: Metrics) -> Optional[tuple[str, str]]:
    """(name, text) of the peak-memory line of a run summary; None when nothing was measured."""
    memory = metrics.memory
    if memory is None or memory.peak.mb is None:
        return None
    peak = memory.peak
    if not peak.on_gpu:
        return "host memory", f"peak RSS {fmt(peak.mb, 0)} MiB (whole process)"
    warm = memory.peak_allocated_incl_warmup_mb
    warm_text = f" (with warm-up {fmt(warm, 0)} MiB)" if warm and peak.mb and warm > 1.05 * peak.mb else ""
    return "GPU memory", (f"peak allocated {fmt(peak.mb, 0)} MiB{warm_text} · reserved "
                          f"{fmt(memory.peak_reserved_mb, 0)} MiB of {fmt(memory.device_total_mb, 0)} MiB")


def run_title(result: Result) -> str:
    """"perflab run" or "perflab profile" (by the command that made it), then workload, mode, batch, precision, device."""
    cfg = result.config
    device = describe_device(result.environment, cfg.device)
    batch = f"batch {cfg.batch_size}" if cfg.batch_size else None
    parts = [cfg.workload, cfg.mode, batch, cfg.precision, device]  # a script run has no precision
    return f"perflab {run_kind(result)} · " + " · ".join(part for part in parts if part)


def result_table(result: Result) -> Table:
    m = result.metrics
    throughput = m.throughput_samples_per_s
    levers = ", ".join(result.levers) or "none (baseline)"
    table = Table(title=run_title(result), title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    interval = interval_text(throughput.ci95_low, throughput.ci95_high, throughput.n, fmt)
    table.add_row("throughput", f"{fmt(throughput.median)} samples/s  ({interval}, spread "
                  f"{fmt(throughput.range_pct)}% over {throughput.n} trials)")
    if m.steps_per_s is not None:  # a script run: steps found in the script, the first --warmup of them not timed
        table.add_row("steps", f"{fmt(m.steps_per_s, 2)} steps/s · {result.trials[0].steps} "
                      f"timed of {m.steps_seen} (warm-up {result.config.warmup}) · "
                      f"{result.timing.get('steps', '')}")
    lat = m.latency_ms
    table.add_row("step latency", f"p50 {fmt(lat.p50, 2)} ms · p95 {fmt(lat.p95, 2)} ms · "
                  f"p99 {fmt(lat.p99, 2)} ms")
    table.add_row("levers", levers)
    for name, text in distributed_rows(m):
        table.add_row(name, text)
    flops = m.flops
    if flops is not None and flops.per_sample:
        mfu = f"MFU {fmt(flops.mfu_pct)}% of {fmt(flops.peak_tflops)} TFLOP/s ({flops.peak_source})" \
            if flops.mfu_pct is not None else f"MFU n/a: {flops.note or no_ceiling(flops.peak_source)}"
        table.add_row("compute", f"{fmt(flops.per_sample / 1e9, 3)} GFLOP/sample · "
                      f"{fmt(flops.achieved_tflops, 3)} TFLOP/s achieved · {mfu}")
    memory = memory_row(m)
    if memory:
        table.add_row(*memory)
    gpu = m.gpu
    if gpu is not None and gpu.samples:
        reasons = ", ".join(gpu.clock_event_reasons or []) or "none"
        table.add_row("GPU (NVML)", f"util mean {fmt(gpu.util_mean_pct)}% (min {fmt(gpu.util_min_pct, 0)}"
                      f"%) · SM clock median {fmt(gpu.sm_clock_median_mhz, 0)} MHz · clock limits seen: {reasons}")
    if m.cost_per_million_samples is not None:
        table.add_row("cost", f"{fmt(m.cost_per_million_samples, 3)} per million samples at "
                      f"{result.config.gpu_cost_per_hour:g} per hour")
    if m.generation is not None:
        add_generation_rows(table, m.generation)
    warm = f"warm-up {fmt(m.warmup_s, 2)} s"
    if m.compile_s is not None:
        warm += f" · compile/capture (first step) {fmt(m.compile_s, 2)} s"
    table.add_row("warm-up", warm)
    if result.quality:
        q = result.quality
        table.add_row("quality", f"{q.verdict}: {q.reason}")
    return table


def add_generation_rows(table: Table, generation: Generation) -> None:
    """TTFT, TPOT, ITL, tokens/s, the share of the bandwidth bound, speculative and goodput figures."""
    ttft, tpot = (figure or Latency() for figure in (generation.ttft_ms, generation.tpot_ms))
    # a loop timed whole observes no gap between two tokens (generation/loop_timing.py): no ITL to show
    itl = "" if generation.itl_ms is None else f"ITL p99 {fmt(generation.itl_ms.p99, 3)} ms · "
    table.add_row("generation", f"TTFT p50 {fmt(ttft.p50, 2)} ms · TPOT p50 {fmt(tpot.p50, 3)} ms · {itl}"
                  f"{fmt(generation.output_tokens_per_s)} tokens/s · {fmt(generation.requests_per_s, 2)} requests/s")
    if generation.timed_path == "loop":
        table.add_row("timed", "the workload's own generation loop, called whole: TTFT = a call for 1 token, TPOT = "
                      "(a call for N tokens - a call for 1) / (N - 1), the loop's own work per token included")
    bound = generation.bandwidth_bound
    if bound is not None and bound.pct_of_bound is not None:
        table.add_row("bandwidth bound", f"{fmt(bound.pct_of_bound)}% of the bound: {fmt(bound.measured_ms_per_token, 3)}"
                      f" ms per decode step vs {fmt(bound.bound_ms_per_token, 3)} ms to read "
                      f"{fmt(bound.weight_bytes / 1e6, 1)} MB of weights + KV cache at {fmt(bound.memory_gbps, 0)} "
                      f"GB/s ({bound.memory_gbps_source})")
    elif bound is not None:
        table.add_row("bandwidth bound", f"n/a: {no_ceiling(bound.memory_gbps_source)}")
    compiled = generation.decode_compile
    if compiled is not None:
        skips, graphs = compiled.cudagraph_skips, compiled.graphs
        waits = bound.device_wait_ms_per_token if bound is not None else None
        table.add_row("decode step", f"compiled {compiled.mode}, decode tuning {compiled.decode_tuning}, SDPA "
                      f"{(compiled.decode_sdpa or '').split(' ')[0]}" +
                      (f" · CUDA graphs by {graphs}" if graphs else "") +
                      (f" · CUDA-graph skips {skips}" if skips is not None else "") +
                      (f" · device waits {fmt(waits, 3)} ms per token for the host" if waits is not None else ""))
    speculative = generation.speculative
    if speculative is not None and speculative.acceptance_rate is not None:
        table.add_row("speculative", f"K={speculative.k} · acceptance {fmt(100 * speculative.acceptance_rate)}% · "
                      f"{fmt(speculative.tokens_per_target_forward, 2)} tokens per target forward" +
                      (f" · {fmt(speculative.speedup_vs_plain, 2)}x vs plain decoding (quality gate)"
                       if speculative.speedup_vs_plain is not None else ""))
    goodput = generation.goodput
    if goodput is not None:
        slo = ", ".join(f"{key} ≤ {value:g} ms" for key, value in goodput.slo_ms.items())
        table.add_row("goodput", f"{fmt(goodput.goodput_requests_per_s, 2)} requests/s "
                      f"({fmt(goodput.requests_meeting_slo_pct)}% meet {slo})")
    regime = generation.decode_regime
    if regime:
        table.add_row("decode", f"{regime['cls']}: {regime['summary']}")


def distributed_rows(metrics: Metrics) -> list[tuple[str, str]]:
    """The ranks (throughput per rank, straggler spread, memory by rank) and the exposed communication."""
    dist = metrics.distributed
    if dist is None:
        return []
    memory = [rank.memory.peak.mb for rank in dist.per_rank]
    rows = [("ranks", f"{dist.world_size} ({dist.parallel}, {dist.backend}) · global batch "
                      f"{dist.global_batch_size} · {fmt(dist.throughput_per_rank_samples_per_s)} samples/s per "
                      f"rank · straggler spread {fmt(dist.straggler_spread_pct)}% (slowest: rank "
                      f"{dist.slowest_rank}) · peak MiB by rank {', '.join(fmt(mb, 0) for mb in memory)}")]
    comm = metrics.collectives
    if comm:
        rows.append(("communication", f"{fmt(comm['communication_ms_per_step'], 2)} ms NCCL per step, "
                                      f"{fmt(comm['overlap_pct'])}% overlapped with compute · exposed "
                                      f"{fmt(comm['exposed_ms_per_step'], 2)} ms = "
                                      f"{fmt(comm['exposed_share_pct'])}% of the step (worst: rank "
                                      f"{comm.get('worst_rank', 0)})"))
    return rows


def phase_table(result: Result) -> Table:
    m = result.metrics
    title = "step-time breakdown (mean per step)"
    # as wide as its title and caption, so neither wraps inside a narrow three-column table
    table = Table(title=title, title_justify="left", caption_justify="left",
                  min_width=max(len(title), len(result.timing.get("phases", ""))) + 4)
    table.add_column("phase")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    phases = m.phases_ms
    for name in sorted(phases, key=phase_sort_key):
        table.add_row(name, fmt(phases[name], 3), fmt(m.phase_share_pct.get(name), 1, "%"))
    table.caption = result.timing.get("phases", "")
    return table


def print_result(console: Console, result: Result) -> None:
    console.print(result_table(result))
    console.print(phase_table(result))
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    if result.path:
        console.print(f"saved [bold]{result.path}[/]")


def no_ceiling(source: str) -> str:
    """'none: run `perflab calibrate` ...' (the source of a ceiling there is none of) as what to do."""
    return (source or "no ceiling").removeprefix("none: ")
