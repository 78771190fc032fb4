"""The Markdown report of a serve result: settings, points, max QPS, the harness's capacity, plots, diagnosis."""
from __future__ import annotations

from typing import Optional

from perflab.environment import describe_device
from perflab.report.markdown import config_table, diagnosis_text, environment_table, image, num, table
from perflab.report.serve_table import (capacity_text, dispatch_delay_p99_ms, gpu_util_pct, validity_lines,
                                       verdict_word)
from perflab.results import Result
from perflab.serve.metrics import COMPONENTS


def serve_markdown(result: Result, images: dict[str, str], run_dir: Optional[str] = None) -> str:
    cfg, serve = result.config, result.metrics.serve
    settings = serve.settings
    device = describe_device(result.environment, cfg.device)
    rows = [[str(p.index), p.scenario, num(p.offered_qps, 0), num(p.realised_offered_qps, 1), num(p.achieved_qps, 1),
             *[num(p.latency_ms[key], 2) for key in ("p50", "p90", "p99", "p99.9")],
             f"{num(p.batch_mean)} ({num(p.batch_fill_pct, 0)}%)", num(p.instance_busy_pct, 0),
             num(gpu_util_pct(p), 0), num(p.cost_per_million_queries, 3), verdict_word(p)] for p in serve.points]
    tail_rows = [[str(p.index)] + [num(p.time_ms["tail"].get(part), 2) for part in COMPONENTS]
                 + [num(dispatch_delay_p99_ms(p), 2)] for p in serve.points]
    summary = [f"- **scenario**: {serve.scenario}; schedule seed {serve.schedule_seed}, sample seed "
               f"{serve.sample_seed}",
               f"- **batcher**: max batch {settings.max_batch}, timeout {settings.batch_timeout_ms:g} ms, "
               f"{settings.instances} instance(s); levers: {', '.join(result.levers) or 'none'}",
               f"- **bound**: p99 ≤ {settings.p99_ms:g} ms; each point ≥ {settings.duration_s:g} s and ≥ "
               f"{settings.min_queries} queries"]
    if serve.search:
        summary.append(f"- **max QPS** with p99 ≤ {settings.p99_ms:g} ms: "
                       f"{num(serve.max_qps, 1) if serve.max_qps else 'none (the lowest rate failed)'} "
                       f"({len(serve.search.tried)} points, widen then bisect to "
                       f"{100 * serve.search.tolerance:g}%)")
    capacity = serve.capacity
    if capacity:
        summary.append(f"- **harness capacity** (no-op model): {capacity_text(capacity)}")
    summary += [f"- {line}" for line in validity_lines(serve.points)]
    if not serve.complete:
        summary.append("- **interrupted**: only the finished points are here")
    parts = [
        f"# perflab serve: {cfg.workload} · {serve.scenario} · max batch {settings.max_batch} · "
        f"{cfg.precision} · {device}",
        f"Measured {result.created_utc or 'n/a'} with perflab {result.perflab_version}. Command: "
        f"`{' '.join(result.command)}`",
        "## Summary", "\n".join(summary),
        "## Points", table(["#", "scenario", "offered q/s", "realised q/s", "achieved q/s", "p50 ms", "p90 ms",
                            "p99 ms", "p99.9 ms", "batch (fill)", "busy %", "GPU %", "cost/1M queries", "verdict"],
                           rows, "rlrrrrrrrrrrrl"),
        "Latency is measured from each query's scheduled arrival (as LoadGen does), so a late dispatch counts. "
        "Percentiles are nearest-rank; a point is VALID as LoadGen judges one (minimum duration and query count, "
        "p99 within the bound, early stopping met at 99% confidence); realised q/s is the rate the seeded schedule "
        "really offered.",
        "## Latency vs offered load", image("latency vs offered load", images.get("latency")),
        "## Where the p99 tail goes (mean ms per query at or past p99)",
        table(["#"] + [part.replace("_", " ") for part in COMPONENTS] + ["dispatch delay p99 (batches)"], tail_rows,
              "r" * (len(COMPONENTS) + 2)),
        image("where a query's time goes", images.get("breakdown")),
        "## Batch fill", image("batch fill", images.get("fill")),
    ]
    diagnosis = diagnosis_text(result.diagnosis, run_dir)
    parts += [diagnosis] if diagnosis.lstrip().startswith("## Diagnosis") else ["## Diagnosis", diagnosis]
    if result.notes:
        parts += ["## Notes", "\n".join(f"- {note}" for note in result.notes)]
    parts += ["## Configuration", config_table(cfg.run_config().to_dict()),
              config_table(getattr(cfg, "serve", None) or {}), "## Environment", environment_table(result.environment)]
    return "\n\n".join(part for part in parts if part) + "\n"
