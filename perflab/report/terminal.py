"""The human summary of a result, as rich tables."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

from perflab.environment import describe_device
from perflab.results import Result

PHASE_ORDER = ["data_wait", "h2d", "augment", "prefill", "decode", "forward", "backward", "optimizer", "step",
               "unattributed"]


def fmt(value: Optional[float], digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def result_table(result: Result) -> Table:
    m, cfg = result.metrics, result.config
    throughput = m["throughput_samples_per_s"]
    device = describe_device(result.environment, cfg["device"])
    levers = ", ".join(result.levers) or "none (baseline)"
    table = Table(title=f"perflab run · {cfg['workload']} · {cfg['mode']} · batch {cfg['batch_size']} · "
                        f"{cfg['precision']} · {device}", title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    table.add_row("throughput", f"{fmt(throughput['median'])} samples/s  (95% CI {fmt(throughput['ci95_low'])}"
                  f"–{fmt(throughput['ci95_high'])}, spread {fmt(throughput['range_pct'])}% over "
                  f"{throughput['n']} trials)")
    lat = m["latency_ms"]
    table.add_row("step latency", f"p50 {fmt(lat['p50'], 2)} ms · p95 {fmt(lat['p95'], 2)} ms · "
                  f"p99 {fmt(lat['p99'], 2)} ms")
    table.add_row("levers", levers)
    flops = m.get("flops") or {}
    if flops.get("per_sample"):
        mfu = f"MFU {fmt(flops['mfu_pct'])}% of {fmt(flops['peak_tflops'])} TFLOP/s ({flops['peak_source']})" \
            if flops.get("mfu_pct") is not None else f"MFU n/a: {flops['peak_source']}"
        table.add_row("compute", f"{fmt(flops['per_sample'] / 1e9, 3)} GFLOP/sample · "
                      f"{fmt(flops['achieved_tflops'], 3)} TFLOP/s achieved · {mfu}")
    memory = m.get("memory") or {}
    if "peak_allocated_mb" in memory:
        warm = memory.get("peak_allocated_incl_warmup_mb")
        warm_text = f" (with warm-up {fmt(warm, 0)} MiB)" if warm and warm > 1.05 * memory["peak_allocated_mb"] else ""
        table.add_row("GPU memory", f"peak allocated {fmt(memory['peak_allocated_mb'], 0)} MiB{warm_text} · reserved "
                      f"{fmt(memory['peak_reserved_mb'], 0)} MiB of {fmt(memory['device_total_mb'], 0)} MiB")
    elif memory:
        table.add_row("host memory", f"peak RSS {fmt(memory['host_peak_rss_mb'], 0)} MiB (whole process)")
    gpu = m.get("gpu")
    if gpu and gpu.get("samples"):
        reasons = ", ".join(gpu["clock_event_reasons"]) or "none"
        table.add_row("GPU (NVML)", f"util mean {fmt(gpu['util_mean_pct'])}% (min {fmt(gpu['util_min_pct'], 0)}"
                      f"%) · SM clock median {fmt(gpu['sm_clock_median_mhz'], 0)} MHz · clock limits seen: {reasons}")
    if m.get("generation"):
        add_generation_rows(table, m["generation"])
    warm = f"warm-up {fmt(m.get('warmup_s'), 2)} s"
    if m.get("compile_s") is not None:
        warm += f" · compile/capture (first step) {fmt(m['compile_s'], 2)} s"
    table.add_row("warm-up", warm)
    if result.quality:
        q = result.quality
        table.add_row("quality", f"{q.get('verdict', '?')}: {q.get('reason', '')}")
    return table


def add_generation_rows(table: Table, generation: dict) -> None:
    """TTFT, TPOT, ITL, tokens/s, the share of the bandwidth bound, speculative and goodput figures."""
    ttft, tpot, itl = generation["ttft_ms"] or {}, generation["tpot_ms"] or {}, generation["itl_ms"] or {}
    table.add_row("generation", f"TTFT p50 {fmt(ttft.get('p50'), 2)} ms · TPOT p50 {fmt(tpot.get('p50'), 3)} ms · "
                  f"ITL p99 {fmt(itl.get('p99'), 3)} ms · {fmt(generation['output_tokens_per_s'])} tokens/s · "
                  f"{fmt(generation['requests_per_s'], 2)} requests/s")
    bound = generation.get("bandwidth_bound") or {}
    if bound.get("pct_of_bound") is not None:
        table.add_row("bandwidth bound", f"{fmt(bound['pct_of_bound'])}% of the bound: {fmt(bound['measured_ms_per_token'], 3)}"
                      f" ms per decode step vs {fmt(bound['bound_ms_per_token'], 3)} ms to read "
                      f"{fmt(bound['weight_bytes'] / 1e6, 1)} MB of weights + KV cache at {fmt(bound['memory_gbps'], 0)} "
                      f"GB/s ({bound['memory_gbps_source']})")
    elif bound:
        table.add_row("bandwidth bound", f"n/a: {bound.get('memory_gbps_source')}")
    speculative = generation.get("speculative")
    if speculative and speculative.get("acceptance_rate") is not None:
        table.add_row("speculative", f"K={speculative['k']} · acceptance {fmt(100 * speculative['acceptance_rate'])}% · "
                      f"{fmt(speculative['tokens_per_target_forward'], 2)} tokens per target forward" +
                      (f" · {fmt(speculative['speedup_vs_plain'], 2)}x vs plain decoding (quality gate)"
                       if speculative.get("speedup_vs_plain") is not None else ""))
    goodput = generation.get("goodput")
    if goodput:
        slo = ", ".join(f"{key} ≤ {value:g} ms" for key, value in goodput["slo_ms"].items())
        table.add_row("goodput", f"{fmt(goodput['goodput_requests_per_s'], 2)} requests/s "
                      f"({fmt(goodput['requests_meeting_slo_pct'])}% meet {slo})")
    regime = generation.get("decode_regime")
    if regime:
        table.add_row("decode", f"{regime['cls']}: {regime['summary']}")


def phase_table(result: Result) -> Table:
    m = result.metrics
    table = Table(title="step-time breakdown (mean per step)", title_justify="left")
    table.add_column("phase")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    phases = m["phases_ms"]
    for name in sorted(phases, key=lambda n: PHASE_ORDER.index(n) if n in PHASE_ORDER else 99):
        table.add_row(name, fmt(phases[name], 3), fmt(m["phase_share_pct"].get(name), 1, "%"))
    table.caption = result.timing.get("phases", "")
    return table


def print_result(console: Console, result: Result) -> None:
    console.print(result_table(result))
    console.print(phase_table(result))
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    if result.path:
        console.print(f"saved [bold]{result.path}[/]")
