"""write_report(DIR): report.md, report.html and plots for a run, a sweep or a comparison directory."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from perflab.errors import PerflabError
from perflab.results.metrics import Metrics
from perflab.report.html import markdown_to_html
from perflab.report.markdown import compare_markdown, run_markdown, sweep_markdown
from perflab.report.operators import top_ops_plot
from perflab.report.plots import latency_histogram, phase_breakdown_plot, sweep_plots
from perflab.results import RESULT_FILE, Result, atomic_file, read_json_object
from perflab.results.kind import detect_kind
from perflab.sweep import SWEEP_JSON, SweepMeta, read_points
from perflab.compare import load_comparison
from perflab.report.serve_markdown import serve_markdown
from perflab.report.serve_plots import serve_plots
from perflab.report.tune import tune_report

REPORT_MD = "report.md"
REPORT_HTML = "report.html"


def _names(paths: dict[str, Optional[Path]], out: Path) -> dict[str, str]:
    return {name: str(Path(path).relative_to(out)) for name, path in paths.items() if path is not None}


def _run_report(directory: Path, out: Path) -> str:
    result = Result.load(directory)
    label = f"batch {result.config.batch_size}"
    images = _names({
        "breakdown": phase_breakdown_plot({label: result.metrics.phases_ms}, out / "step_breakdown.png"),
        "latency": latency_histogram({label: [ms for t in result.trials for ms in t.step_ms]}, out / "latency_hist.png"),
        "top_ops": top_ops_plot((result.diagnosis or {}).get("operators") or {}, out / "top_ops.png"),
    }, out)
    return run_markdown(result, images, str(directory))


def _sweep_report(directory: Path, out: Path) -> str:
    points = read_points(directory)
    meta_path = directory / SWEEP_JSON
    meta = SweepMeta.from_dict(read_json_object(meta_path, "a sweep record", "re-run the sweep")
                               if meta_path.is_file() else {})
    ok = [point for point in points if point.ok]
    images = _names(sweep_plots([point.to_dict() for point in points], meta.axes, out), out) if ok else {}
    environment = None
    if ok and ok[0].dir and (directory / ok[0].dir / RESULT_FILE).is_file():
        environment = Result.load(directory / ok[0].dir).environment
    return sweep_markdown(meta, points, images, environment)


def _compare_report(directory: Path, out: Path) -> str:
    comparison = load_comparison(directory)
    base, cand = comparison.base, comparison.candidate
    images = _names({
        "breakdown": phase_breakdown_plot({"baseline": Metrics.from_dict(base.metrics).phases_ms,
                                           "candidate": Metrics.from_dict(cand.metrics).phases_ms},
                                          out / "step_breakdown.png", "step-time breakdown: baseline vs candidate"),
        "latency": latency_histogram({"baseline": base.step_ms or [], "candidate": cand.step_ms or []},
                                     out / "latency_hist.png"),
    }, out)
    return compare_markdown(comparison, images)


def _serve_report(directory: Path, out: Path) -> str:
    result = Result.load(directory)
    return serve_markdown(result, _names(serve_plots(result.metrics.serve, out), out), str(directory))


def _tune_report(directory: Path, out: Path) -> str:
    return tune_report(directory, out)


def _memory_report(directory: Path, out: Path) -> str:
    from perflab.memory.study import load_study  # the memory study (and torch's profiler) only for its report
    from perflab.report.memory import MEMORY_PLOT, memory_markdown, memory_timeline_plot  # as above

    study = load_study(directory)
    image = memory_timeline_plot(study.breakdown, out / MEMORY_PLOT)
    return memory_markdown(study, _names({"timeline": image}, out).get("timeline"))


BUILDERS = {"memory": _memory_report, "run": _run_report, "sweep": _sweep_report, "compare": _compare_report, "serve": _serve_report,
            "tune": _tune_report}


def write_report(directory: Union[str, Path], out: Optional[Union[str, Path]] = None) -> list[Path]:
    """Write report.md, report.html (self-contained) and the PNG plots; returns the report files."""
    directory = Path(directory)
    if directory.is_file():
        directory = directory.parent
    if not directory.is_dir():
        raise PerflabError(f"no directory at {directory}: give a run, sweep or compare directory")
    out = Path(out) if out else directory
    out.mkdir(parents=True, exist_ok=True)
    kind = detect_kind(directory)
    text = BUILDERS[kind](directory, out)
    title = text.splitlines()[0].lstrip("# ").strip()
    pages = {out / REPORT_MD: text, out / REPORT_HTML: markdown_to_html(text, out, title)}
    for path, page in pages.items():  # both built before either replaces an older report
        with atomic_file(path) as temp:
            temp.write_text(page)
    return list(pages)
