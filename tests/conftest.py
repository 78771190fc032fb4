"""Shared test setup: CUDA tests skip without a GPU; every test gets its own calibration cache; a run that narrows
the CPU's instruction set gets an Inductor cache of its own."""
import getpass
import os
import tempfile

import pytest
import torch

# The variables that make this CPU act as a lesser one (.ci/run's AVX2 pass). Inductor's on-disk cache does not key
# on them (torch 2.14): a compiled graph cached by a native AVX-512 run, with oneDNN weights packed for AVX-512, was
# reused under ONEDNN_MAX_CPU_ISA=AVX2 and computed garbage (relative output error 0.71 in test_levers'
# compile run). Each capability gets its own cache folder; set before anything compiles, and inherited by the
# subprocesses the tests start.
NARROWING = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
if any(os.environ.get(name) for name in NARROWING) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    tag = "-".join(os.environ.get(name, "default").lower() for name in NARROWING)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                         f"torchinductor_{getpass.getuser()}_{tag}")

# Under pytest-xdist (`pytest -n 2`), each worker runs on a core of its own: perflab's interference probe counts other
# work only on the cores a run may use, so the other worker's tests do not make this one's runs "busy", and timings
# stay a single core's. The processes a test starts inherit the core.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _CPUS = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_CPUS[int(_WORKER[2:]) % len(_CPUS)]})


def pytest_report_header(config):
    from perflab.backends import bf16_is_native, cpu_capability
    native = "native" if bf16_is_native(torch.device("cpu")) else "emulated (oneDNN converts to fp32)"
    return f"perflab: CPU capability {cpu_capability()}, bf16 {native}, torch {torch.__version__}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: pytest -m cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def one_cpu_thread():
    # Two OpenMP threads on a small shared 2-core machine spin against each other; one keeps runs fast
    # and their timings steady.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path / "cache"))
