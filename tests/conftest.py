"""Shared test setup: CUDA tests skip without a GPU; every test gets its own calibration cache."""
import pytest
import torch


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
