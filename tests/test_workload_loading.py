import pytest

from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.workloads import BUILTIN_MODULES, builtin_descriptions, default_batch, load_workload

CFG = RunConfig(workload="x", device="cpu", batch_size=2)


def write(tmp_path, text, name="wl.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_every_builtin_has_a_description_and_cpu_and_cuda_default_batches():
    descriptions = builtin_descriptions()
    assert {"driving", "resnet50", "mlp"} <= set(descriptions)
    for name in BUILTIN_MODULES:
        assert descriptions[name]
        assert default_batch(name, "cpu") > 0 and default_batch(name, "cuda") > 0


def test_unknown_builtin_lists_the_choices():
    with pytest.raises(PerflabError, match="unknown workload 'nope': use one of driving"):
        load_workload("nope", CFG)


def test_missing_file_says_which_path(tmp_path):
    with pytest.raises(PerflabError, match="does not exist"):
        load_workload(str(tmp_path / "missing.py") + ":build", CFG)


def test_file_without_build_says_what_to_define(tmp_path):
    spec = write(tmp_path, "x = 1\n") + ":build"
    with pytest.raises(PerflabError, match="has no 'build'"):
        load_workload(spec, CFG)


def test_build_returning_the_wrong_type_is_refused(tmp_path):
    spec = write(tmp_path, "def build(cfg):\n    return 42\n") + ":build"
    with pytest.raises(PerflabError, match="returned int, expected a perflab.Workload"):
        load_workload(spec, CFG)


def test_syntax_error_in_user_file_names_the_line(tmp_path):
    spec = write(tmp_path, "def build(cfg)\n    pass\n") + ":build"
    with pytest.raises(PerflabError, match="syntax error at .*wl.py:1: .*\n    def build\\(cfg\\)"):
        load_workload(spec, CFG)


def test_missing_module_is_a_clear_error():
    with pytest.raises(PerflabError, match="no module named 'not_a_real_pkg'"):
        load_workload("not_a_real_pkg.sub:build", CFG)


def test_module_spec_loads_a_build_function(tmp_path, monkeypatch):
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "models.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
        "def make(cfg):\n"
        "    return perflab.Workload(name='pkg', model=torch.nn.Linear(4, 2),\n"
        "        dataset=TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), loss_fn=torch.nn.MSELoss())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    workload = load_workload("userpkg.models:make", CFG)
    assert workload.name == "pkg"


def test_training_without_a_loss_is_refused(tmp_path):
    spec = write(tmp_path,
                 "import torch\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
                 "def build(cfg):\n"
                 "    return perflab.Workload(name='n', model=torch.nn.Linear(4, 2),\n"
                 "        dataset=TensorDataset(torch.randn(8, 4), torch.randn(8, 2)))\n") + ":build"
    with pytest.raises(PerflabError, match="--mode train needs Workload.loss_fn"):
        load_workload(spec, CFG)


TINY_PLUGIN = ("import torch\nfrom torch.utils.data import TensorDataset\nimport perflab\n"
               "def build(cfg):\n"
               "    return perflab.Workload(name='tiny', model=torch.nn.Linear(4, 2),\n"
               "        dataset=TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), loss_fn=torch.nn.MSELoss())\n")


def test_plugin_run_folder_is_named_after_the_plugin_not_its_build_function(tmp_path, monkeypatch):
    from perflab.cli import main

    spec = write(tmp_path, TINY_PLUGIN, name="tiny_regressor.py") + ":build"
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--workload", spec, "--device", "cpu", "--batch", "4", "--steps", "2", "--trials", "1",
                 "--warmup", "1"]) == 0
    [run_dir] = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("-tiny_regressor")


@pytest.mark.parametrize("spec, name", [("mlp", "mlp"), ("models/bert.py:build", "bert"), ("models/bert.py", "bert"),
                                        ("mypkg.vision:make", "mypkg.vision")])
def test_default_run_folder_names(spec, name):
    from perflab.results.rundir import default_run_dir

    assert default_run_dir(spec).name.split("-", 2)[-1] == name


def test_workload_descriptions_say_what_a_workload_is_not_where_it_came_from(capsys):
    from perflab.cli import main

    assert main(["workloads"]) == 0
    listing = capsys.readouterr().out
    assert "mlp" in listing and "ResNet-50" in listing
    assert "seed" not in listing.lower()
