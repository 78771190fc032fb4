"""Terminal tables read at 80 columns: no column squeezed to nothing, long texts whole, nothing cut off."""
import copy
from pathlib import Path

import pytest
from rich.console import Console

from perflab.compare import compare_results
from perflab.levers import all_levers
from perflab.report.compare_table import print_comparison
from perflab.report.levers_table import print_levers
from perflab.results import Result
from perflab.results.quality import QualityVerdict

FIXTURE = Path(__file__).parent / "fixtures" / "traces" / "cpu" / "compute__big_matmul.result.json"
LONG_REASON = ("relative output error 3.1e-01 > 2e-02 tolerance for bf16 inference; top-1 agreement 91.0% "
               "< 99.0% on 512 held-out samples")


def rendered(width: int, draw) -> str:
    console = Console(width=width, record=True, color_system=None)
    draw(console)
    return console.export_text()


def column_widths(text: str) -> list[int]:
    """Widths of the columns of the first table in `text`, from its top border ┏━━┳━━┓ (which must be whole)."""
    border = next(line for line in text.splitlines() if line.startswith("┏"))
    assert border.endswith("┓"), "the table is wider than the terminal: its right edge is cut off"
    return [len(segment) for segment in border.strip("┏┓").split("┳")]


def test_levers_at_80_columns_keep_every_column_readable_and_point_to_the_rest():
    text = rendered(80, lambda console: print_levers(console, all_levers()))
    assert all(len(line) <= 80 for line in text.splitlines())
    assert all(width >= 12 for width in column_widths(text)), column_widths(text)
    assert "what it does" in text and "needs" in text
    assert "--channels-last" in text and "--activation-checkpointing" in text  # flags whole, not cut with "…"
    assert "…" not in text
    assert "docs/levers.md" in text  # the dropped column is named, with where to read it


def test_levers_wide_terminal_shows_what_each_lever_addresses():
    text = rendered(140, lambda console: print_levers(console, all_levers()))
    assert "addresses" in text and "input pipeline" in text
    assert all(width >= 12 for width in column_widths(text))


@pytest.fixture(scope="module")
def comparison():
    base = Result.load(FIXTURE)
    candidate = copy.deepcopy(base)
    candidate.quality = QualityVerdict.from_dict({"verdict": "fail", "reason": LONG_REASON,
                                                  "metrics": {"rel_error": 0.31}})
    return compare_results(base, candidate)


def test_compare_at_80_columns_keeps_columns_readable_and_the_quality_reason_whole(comparison):
    text = rendered(80, lambda console: print_comparison(console, comparison))
    assert all(len(line) <= 80 for line in text.splitlines())
    assert min(column_widths(text)) >= 8, column_widths(text)
    # The reason is printed under the table as running text, not squeezed into a column a word per line.
    assert LONG_REASON in " ".join(text.split())
    reason_lines = [line for line in text.splitlines() if "relative output error" in line]
    assert reason_lines and not reason_lines[0].startswith("│")


def sweep_summary(params: dict) -> "SweepSummary":
    from perflab.sweep import SweepPoint, SweepSummary

    rows = [SweepPoint(index=i, key=str(i), label=" ".join(f"{k}={v}" for k, v in {**params, "batch": batch}.items()),
                       params={**params, "batch_size": batch}, status="ok", throughput=12345.6, p50_ms=12.34,
                       p95_ms=123.45, peak_memory_mb=23456.0, mfu_pct=45.6, memory_kind="GPU peak allocated")
            for i, batch in enumerate((8, 16, 32))]
    return SweepSummary(Path("runs/20261123-081307-sweep"), list(params) + ["batch_size"], rows, rows[2], None, None, {})


def test_sweep_at_80_columns_keeps_every_number_whole():
    from perflab.report.sweep_table import print_sweep_summary

    summary = sweep_summary({"precision": "bf16", "channels_last": True, "compile": "max-autotune"})
    text = rendered(80, lambda console: print_sweep_summary(console, summary))
    column_widths(text)  # the right edge is there
    assert "…" not in text
    for number in ("12,345.6", "12.34", "123.45", "23,456", "45.6"):
        assert text.count(number) >= 3, number
    assert "2 ★" in text


def test_sweep_on_a_wide_terminal_has_a_column_per_swept_option():
    from perflab.report.sweep_table import sweep_table

    console = Console(width=160, record=True, color_system=None)
    console.print(sweep_table(sweep_summary({"precision": "bf16", "channels_last": True}), 160))
    header = next(line for line in console.export_text().splitlines() if "samples/s" in line)
    assert "precision" in header and "channels_last" in header and "batch" in header
