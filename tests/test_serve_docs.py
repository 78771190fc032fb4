"""The CPU `perflab serve` examples of docs/serve.md and docs/generate.md run as written: each command line that
says `--device cpu` is run in a real process (only `--out` added, into a temporary folder) and must exit 0."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("docs/serve.md", "docs/generate.md")


def fenced_commands(document: str) -> list[str]:
    """Every `perflab serve` command in the document's fenced blocks (backslash continuations joined, comments cut)."""
    commands, inside, pending = [], False, ""
    for line in (ROOT / document).read_text().splitlines():
        if line.startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        text = pending + line.split("  #")[0].strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        if text.startswith("perflab serve "):
            commands.append(text)
    return commands


CPU_EXAMPLES = [(document, command) for document in DOCUMENTS for command in fenced_commands(document)
                if "--device cpu" in command]


def test_the_serve_docs_have_cpu_examples():
    assert {document for document, _ in CPU_EXAMPLES} == set(DOCUMENTS)
    assert len(CPU_EXAMPLES) >= 4


@pytest.mark.parametrize("document,command", CPU_EXAMPLES, ids=[c for _, c in CPU_EXAMPLES])
def test_a_cpu_serve_example_runs_as_written(tmp_path, document, command):
    argv = shlex.split(command)
    if "--loadgen" in argv:
        pytest.importorskip("mlperf_loadgen")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "perflab", *argv[1:], "--out", str(tmp_path / "out")], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{document}: {command}\n{done.stderr[-2000:]}"
    assert (tmp_path / "out" / "result.json").is_file()
