"""`python -m perflab ...` in a real subprocess, for tests whose behaviour is about processes (exit codes, stderr)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def perflab_cli(*args):
    """`python -m perflab ARGS` in a real subprocess, from the repository root, without PERFLAB_DEBUG."""
    environment = {key: value for key, value in os.environ.items() if key != "PERFLAB_DEBUG"}
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "perflab", *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)


def load(out):
    return json.loads((Path(out) / "result.json").read_text())


def wait_for(path: Path, timeout_s: float = 60) -> None:
    """Until `path` exists (a running command reached that point), failing after `timeout_s`."""
    deadline = time.time() + timeout_s
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)
