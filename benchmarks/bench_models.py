"""Area "models": models as their libraries make them, through the plugin (issue 8).

    python -m benchmarks.bench_models --out DIR [--quick]

examples/hf_text_classifier.py (a transformers BERT-style classifier, dict batches, ModelOutput) and
examples/timm_model.py (timm resnet50), each in train and infer, fp32 eager and bf16 + torch.compile; the
bf16 variant runs the quality gate. Rows per variant: throughput (and speed-up over fp32 eager), the
quality verdict (1 = pass) and the gate's measured error (inference: relative output error; training:
final-loss relative delta). An example whose library is not installed gets one row saying so. Without
CUDA (or with --quick) sizes and steps shrink and compile is left out.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from benchmarks.bench_levers import Experiment, run_experiments, slug
from benchmarks.common import Rows, parse_args

EXAMPLES = {  # workload -> (library it needs, batch on CUDA, batch on CPU)
    "examples/hf_text_classifier.py": ("transformers", 32, 4),
    "examples/timm_model.py": ("timm", 64, 2),
}
SMALL_OPTIONS = {"examples/timm_model.py": {"model": "resnet18"}}  # on CPU / --quick


def experiments(cuda: bool, quick: bool, available: list[str]) -> list[Experiment]:
    full = cuda and not quick
    timing = {"steps": 20, "trials": 3, "warmup": 3} if full else {"steps": 2, "trials": 1, "warmup": 1}
    fast = {"precision": "bf16", **({"compile": "default"} if cuda else {}),
            "check_quality": True, "quality_steps": 3 if full else 2}
    fast_label = "bf16+compile" if cuda else "bf16"
    out = []
    for workload in available:
        _, cuda_batch, cpu_batch = EXAMPLES[workload]
        for mode in ("train", "infer"):
            out.append(Experiment(f"{Path(workload).stem} {mode}", workload,
                                  {"mode": mode, "batch_size": cuda_batch if full else cpu_batch, **timing,
                                   "workload_options": {} if full else SMALL_OPTIONS.get(workload, {})},
                                  [("fp32 eager", {}), (fast_label, fast)]))
    return out


def add_quality_rows(rows: Rows, out: Path, experiment: Experiment) -> None:
    """The gate's verdict and error of each variant that ran it, read from its saved result.json."""
    for label, _ in experiment.variants:
        saved = out / slug(f"{experiment.name} {label}") / "result.json"
        quality = json.loads(saved.read_text()).get("quality") if saved.exists() else None
        if not quality:
            continue
        gate_figures = quality["metrics"]
        error_name = "rel_error" if quality["mode"] == "infer" else "final_loss_rel_delta"
        rows.add(experiment.name, f"{label} quality pass", float(quality["verdict"] == "pass"), "",
                 quality["reason"])
        rows.add(experiment.name, f"{label} {error_name}", gate_figures[error_name], "",
                 f"tolerance {quality['tolerances']['rtol']:.1e} ({quality['tolerances']['source']})")


def run(out: Path, quick: bool) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    available = [w for w, (library, _, _) in EXAMPLES.items() if importlib.util.find_spec(library) is not None]
    plan = experiments(cuda, quick, available)
    run_experiments("models", out, plan)
    rows = Rows("models", out)  # rewrites rows.json: the runs' rows, then skips and quality figures
    rows.rows = json.loads((out / "rows.json").read_text()) if (out / "rows.json").exists() else []
    for workload, (library, _, _) in EXAMPLES.items():
        if workload not in available:
            rows.add(Path(workload).stem, "skipped", None, "",
                     f"{library} is not installed: pip install 'perflab[models]'")
    for experiment in plan:
        add_quality_rows(rows, out, experiment)
    return rows.rows


def main() -> None:
    args = parse_args()
    run(args.out, args.quick)


if __name__ == "__main__":
    main()
