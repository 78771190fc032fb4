"""perflab report: report.md and a self-contained report.html for a run, a sweep and a comparison."""
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from perflab.cli import main

CHROMIUM = "/usr/bin/chromium"
TINY = ["--workload", "mlp", "--steps", "3", "--trials", "2", "--warmup", "1", "--device", "cpu"]




@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    """A run, a second run, a sweep and a comparison, each reported once."""
    root = tmp_path_factory.mktemp("reports")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["run", *TINY, "--batch", "32", "--out", str(root / "run")]) == 0
        assert main(["run", *TINY, "--batch", "32", "--out", str(root / "run2")]) == 0
        assert main(["sweep", *TINY, "--batch", "16,32", "--mode", "train,infer", "--out", str(root / "sweep")]) == 0
        assert main(["compare", str(root / "run"), str(root / "run2"), "--out", str(root / "compare")]) == 0
        for name in ("run", "sweep", "compare"):
            assert main(["report", str(root / name)]) == 0
    finally:
        torch.set_num_threads(before)
    return {name: root / name for name in ("run", "sweep", "compare")}


def test_run_report_has_summary_breakdown_diagnosis_config_and_environment(dirs):
    text = (dirs["run"] / "report.md").read_text()
    for heading in ("## Summary", "## Step-time breakdown", "## Trials", "## Diagnosis", "## Configuration",
                    "## Environment"):
        assert heading in text
    assert "![step-time breakdown](step_breakdown.png)" in text
    assert "perflab diagnose" in text  # no diagnosis recorded: the report says how to get one


def test_sweep_report_names_the_best_point_and_shows_the_plots(dirs):
    text = (dirs["sweep"] / "report.md").read_text()
    assert "**best throughput**" in text
    assert text.count("| ok") == 4
    for name in ("throughput_vs_batch.png", "latency_vs_batch.png", "memory_vs_batch.png"):
        assert f"]({name})" in text


def test_compare_report_has_the_decision_and_the_performance_table(dirs):
    text = (dirs["compare"] / "report.md").read_text()
    assert re.search(r"## Decision: (ACCEPT|REJECT|NO SIGNIFICANT CHANGE|NOT JUDGED|INCONCLUSIVE)", text)
    assert "| throughput (samples/s) |" in text and "95% CI of change" in text
    assert "## Where the time went: phases" in text


@pytest.mark.parametrize("kind", ["run", "sweep", "compare"])
def test_html_is_self_contained(dirs, kind):
    page = (dirs[kind] / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert sources and all(src.startswith("data:image/png;base64,") for src in sources)
    assert "<table>" in page and "<style>" in page
    assert not re.search(r'(href|src)="https?:', page), "the page must open without network"


def test_report_of_a_directory_without_results_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "result.json" in capsys.readouterr().err


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)")
@pytest.mark.parametrize("kind", ["sweep", "compare"])
def test_html_renders_tables_and_images_in_headless_chromium(dirs, kind, tmp_path):
    url = (dirs[kind] / "report.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'p'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=60).stdout
    assert dom.count("<table>") >= 3
    assert dom.count('<img src="data:image/png;base64,') >= 2
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,2000", f"--screenshot={shot}", url],
                   capture_output=True, timeout=60, check=True)
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1200)
    not_white = (pixels < 0.9).any(axis=2).mean()
    assert not_white > 0.02, "the page rendered almost nothing"
    # matplotlib's first colour (C0, #1f77b4) appears only if the plots were decoded and drawn
    c0 = np.abs(pixels - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=2) < 0.08
    assert c0.sum() > 200


def test_run_report_is_titled_as_a_run(dirs):
    assert (dirs["run"] / "report.md").read_text().startswith("# perflab run: mlp · train · batch 32")
