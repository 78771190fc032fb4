"""HF transformers + torchao beside perflab's quantized decode (the generate_peers area's quantized part,
benchmarks/peers_quantized.py): the path HF documents, `from_pretrained(..., quantization_config=TorchAoConfig(...))`
and `generate(cache_implementation="static")`, each scheme in a process of its own under a time limit."""
from __future__ import annotations

import dataclasses
import json
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks.common import Rows
from benchmarks.peers_common import Cell, Row, example_module, free_memory, report_row

HF_TORCHAO = "hf generate + torchao"
HF_SCHEMES = ("int8-weight", "int4-weight")  # the weight-only schemes HF's torchao docs show


def parse_hf_schemes(text: str) -> tuple[str, ...]:
    """BENCH_PEERS_QUANT_HF: the schemes HF + torchao runs (comma-separated; empty or 0: none)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip() and name.strip() != "0")
    unknown = [name for name in names if name not in HF_SCHEMES]
    if unknown:
        raise ValueError(f"BENCH_PEERS_QUANT_HF: {', '.join(unknown)}; HF + torchao runs {', '.join(HF_SCHEMES)}")
    return names


def hf_torchao_missing(scheme: str, cuda: bool) -> Optional[str]:
    """Why the HF + torchao peer cannot run `scheme` here, or None."""
    import importlib.util
    if scheme == "int4-weight" and not cuda:
        return "int4 in tinygemm's layout is CUDA-only"
    for package, extra in (("transformers", "models"), ("torchao", "quant"), ("accelerate", "models")):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not importable here: pip install 'perflab[{extra}]'"
    return None


def run_hf_torchao(rows: Rows, cells: list[Cell], cuda: bool, schemes: list[str], deadline: float,
                   gbps: Optional[float]) -> list[Row]:
    """transformers with TorchAoConfig, the path HF documents: the random bf16 model of the cells' shape saved once,
    then for each scheme `from_pretrained(..., quantization_config=TorchAoConfig(config))` with torchao's config for
    it (the one perflab's --quantize-kernel torchao uses: int8 per row, int4 in tinygemm's layout) quantizing while it
    loads, and generate(cache_implementation="static") timed at each cell as the hf generate row is (its compiled
    one-token steps). HF keeps the output head in bf16 (TorchAoConfig's default); the bound counts the bytes it
    stores."""
    import shutil
    import tempfile
    table, runnable = [], []
    for scheme in schemes:
        missing = hf_torchao_missing(scheme, cuda)
        if missing:
            table += [Row(cell, f"{HF_TORCHAO} {scheme}", quality=f"not run: {missing}") for cell in cells]
        else:
            runnable.append(scheme)
    if not runnable:
        return table
    example, device = example_module(), torch.device("cuda" if cuda else "cpu")
    folder = Path(tempfile.mkdtemp(prefix=f"hf-{cells[0].shape}-"))  # 16 GB at 8B: never under the bench's --out
    try:
        began = time.perf_counter()
        model = example.hf_llama(cells[0].shape, device, torch.bfloat16, seed=0)
        model.save_pretrained(folder)
        del model
        free_memory()
        saved_s = time.perf_counter() - began
        for scheme in runnable:
            table += _hf_torchao_scheme(rows, folder, cells, scheme, device, deadline, gbps, saved_s)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return table


HF_LIMIT_S = 240.0  # BENCH_PEERS_QUANT_HF_LIMIT_S: one scheme's own process (load, compile, every cell)


def _hf_torchao_scheme(rows: Rows, folder: Path, cells: list[Cell], scheme: str, device: torch.device,
                       deadline: float, gbps: Optional[float], saved_s: float) -> list[Row]:
    """One scheme's rows, measured in a process of its own (hf_scheme_main) under a time limit: HF's first compiled
    generate of torchao's int8 once had not returned 145 s after loading, and a stall in this process would have cost
    the call every row after it. Each cell's row comes back as soon as it is measured; a cell the limit cut says so."""
    import os
    import subprocess
    import sys
    import tempfile
    system = f"{HF_TORCHAO} {scheme}"
    limit = min(deadline - time.perf_counter(), float(os.environ.get("BENCH_PEERS_QUANT_HF_LIMIT_S", HF_LIMIT_S)))
    if limit <= 0:
        return [Row(cell, system, quality="skipped: past BENCH_PEERS_BUDGET_S") for cell in cells]
    answers = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    command = [sys.executable, "-m", "benchmarks.peers_hf_torchao", "hf-scheme", str(folder), scheme, str(answers),
               json.dumps({"cells": [dataclasses.asdict(cell) for cell in cells], "device": str(device),
                           "gbps": gbps, "saved_s": saved_s})]
    ended = "not measured: its process ended first (see the log)"
    try:
        subprocess.run(command, check=False, timeout=limit, cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        ended = f"not measured within {limit:.0f} s (the limit of its own process: load, compile, warm-up)"
    measured = {}
    for line in answers.read_text().splitlines():
        answer = json.loads(line)
        measured[answer["batch"]] = answer
    answers.unlink()
    table = []
    for cell in cells:
        answer = measured.get(cell.batch)
        if answer is None:
            row = Row(cell, system, quality=ended)
        else:
            row = Row(cell, system, **answer["row"])
            if answer.get("timed"):
                rows.add(f"{cell.shape} bs{cell.batch}", f"{system} tokens/s", row.tokens_per_s, "tokens/s",
                         json.dumps(answer["timed"]))
        table.append(row)
        report_row(row)
    return table


def hf_scheme_main(folder: str, scheme: str, answers: str, settings: str) -> None:
    """The child of _hf_torchao_scheme: load the saved model quantized through TorchAoConfig, time generate at each
    cell, append each cell's row to `answers` (a JSON line) as soon as it is measured."""
    from transformers import LlamaForCausalLM, TorchAoConfig
    from benchmarks.peers_common import bound_ms_per_step, generate_row, time_hf_generate, version
    from perflab.generation.quantize import quantization_config
    given = json.loads(settings)
    cells, device, gbps = [Cell(**cell) for cell in given["cells"]], torch.device(given["device"]), given["gbps"]
    example = example_module()

    def answer(batch: int, row: dict[str, Any], timed: Optional[dict[str, Any]] = None) -> None:
        with open(answers, "a") as stream:
            stream.write(json.dumps({"batch": batch, "row": row, "timed": timed}) + "\n")
    try:
        began = time.perf_counter()
        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, device_map=str(device),
                                                 quantization_config=TorchAoConfig(quantization_config(scheme)))
        load_s = time.perf_counter() - began
        print(f"[generate_peers] {HF_TORCHAO} {scheme}: loaded and quantized in {load_s:.0f}s", flush=True)
    except Exception as err:
        traceback.print_exc()
        for cell in cells:
            answer(cell.batch, {"quality": f"failed to load: {type(err).__name__}: {err}"[:200]})
        return
    head = "quantized" if type(model.lm_head.weight) is not torch.nn.Parameter else "bf16 (TorchAoConfig's default)"
    for cell in cells:
        try:
            timed = time_hf_generate(example.generate_call(model, static=True), model, cell)
            row = generate_row(cell, timed, bound_ms_per_step(cell, gbps, model), version("transformers"))
            answer(cell.batch, {"tokens_per_s": row.tokens_per_s, "ms_per_step": row.ms_per_step,
                                "pct_of_bound": row.pct_of_bound, "spread_pct": row.spread_pct,
                                "quality": f"{row.quality}; loaded and quantized in {load_s:.0f}s (saved once in "
                                           f"{given['saved_s']:.0f}s); output head {head}"}, timed)
        except Exception as err:
            traceback.print_exc()
            answer(cell.batch, {"quality": f"failed: {type(err).__name__}: {err}"[:200]})


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 6 and sys.argv[1] == "hf-scheme":
        hf_scheme_main(*sys.argv[2:])
    else:
        raise SystemExit("usage: python -m benchmarks.peers_hf_torchao hf-scheme FOLDER SCHEME ANSWERS SETTINGS "
                         "(run by benchmarks/bench_generate_peers.py)")
