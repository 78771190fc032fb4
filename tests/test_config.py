import pytest

from perflab.config import RunConfig
from perflab.errors import PerflabError


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 0}, "--batch must be a positive integer"),
    ({"steps": -1}, "--steps must be a positive integer"),
    ({"trials": 0}, "--trials must be a positive integer"),
    ({"warmup": -1}, "--warmup must be 0 or more"),
    ({"mode": "serve"}, "--mode must be one of train, infer"),
    ({"device": "tpu"}, "--device must be one of auto, cuda, cpu"),
    ({"precision": "int8"}, "--precision must be one of"),
    ({"workers": -2}, "--workers must be 0 or more"),
])
def test_invalid_settings_name_the_option_and_what_is_allowed(changes, message):
    with pytest.raises(PerflabError, match=message):
        RunConfig(**changes).validate()


def test_from_dict_ignores_unknown_keys_so_old_results_stay_loadable():
    cfg = RunConfig.from_dict({"workload": "mlp", "batch_size": 4, "from_the_future": True})
    assert cfg.workload == "mlp" and cfg.batch_size == 4


def test_defaults_are_valid():
    assert RunConfig().validate().mode == "train"
