"""The human summary of a result, as rich tables."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

from perflab.environment import describe_device
from perflab.results import Result

PHASE_ORDER = ["data_wait", "h2d", "augment", "forward", "backward", "optimizer", "step", "unattributed"]


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
    for name, text in distributed_rows(m):
        table.add_row(name, text)
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
    warm = f"warm-up {fmt(m.get('warmup_s'), 2)} s"
    if m.get("compile_s") is not None:
        warm += f" · compile/capture (first step) {fmt(m['compile_s'], 2)} s"
    table.add_row("warm-up", warm)
    if result.quality:
        q = result.quality
        table.add_row("quality", f"{q.get('verdict', '?')}: {q.get('reason', '')}")
    return table


def distributed_rows(metrics: dict) -> list[tuple[str, str]]:
    """The ranks (throughput per rank, straggler spread, memory by rank) and the exposed communication."""
    dist = metrics.get("distributed")
    if not dist:
        return []
    memory = [rank["memory"].get("peak_allocated_mb", rank["memory"].get("host_peak_rss_mb"))
              for rank in dist["per_rank"]]
    rows = [("ranks", f"{dist['world_size']} ({dist['parallel']}, {dist['backend']}) · global batch "
                      f"{dist['global_batch_size']} · {fmt(dist['throughput_per_rank_samples_per_s'])} samples/s per "
                      f"rank · straggler spread {fmt(dist['straggler_spread_pct'])}% (slowest: rank "
                      f"{dist['slowest_rank']}) · peak MiB by rank {', '.join(fmt(mb, 0) for mb in memory)}")]
    comm = metrics.get("collectives")
    if comm:
        rows.append(("communication", f"{fmt(comm['communication_ms_per_step'], 2)} ms NCCL per step, "
                                      f"{fmt(comm['overlap_pct'])}% overlapped with compute · exposed "
                                      f"{fmt(comm['exposed_ms_per_step'], 2)} ms = "
                                      f"{fmt(comm['exposed_share_pct'])}% of the step (worst: rank "
                                      f"{comm.get('worst_rank', 0)})"))
    return rows


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
