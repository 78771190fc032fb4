"""Shared test setup: CUDA tests skip without a GPU; every test gets its own calibration cache."""
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: pytest -m cuda)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLAB_CACHE_DIR", str(tmp_path / "cache"))
