"""The torch switches perflab sets and puts back (perflab/backends.py `set_tf32`, the warm worker's reset): the process
is left as it was found. On torch >= 2.9 the legacy TF32 setters also write the per-backend `fp32_precision` flags, and
torch 2.14's Inductor-compiled CPU matmul can abort the process under cuda.matmul "ieee": a calibration that wrote
back "highest" killed a later compiled decode in the same pytest process (tests/test_cli_run.py's calibrate, then
tests/test_decode_step.py's compiled decode, on an AVX-512 CPU). Each case runs in a fresh interpreter, whose
switches nobody has touched."""
import json
import subprocess
import sys
import textwrap

import pytest

# the switches' values a fresh process reports, before and after the code under test, as JSON on stdout
PROBE = textwrap.dedent("""
    import json, torch
    from perflab.backends import set_tf32
    from perflab.tune.worker import read_switches, reset_between_trials, torch_switches

    def flags():
        owners = {"cuda.matmul": torch.backends.cuda.matmul, "cudnn.conv": torch.backends.cudnn.conv,
                  "mkldnn.matmul": torch.backends.mkldnn.matmul} if hasattr(torch.backends.cudnn, "conv") else {}
        state = {name: getattr(owner, "fp32_precision", None) for name, owner in owners.items()}
        state["matmul"] = torch.get_float32_matmul_precision()
        state["cudnn"] = torch.backends.cudnn.allow_tf32
        return state

    before = flags()
    BODY
    print(json.dumps({"before": before, "after": flags(), "extra": extra}))
""")


def probe(body: str) -> dict:
    code = PROBE.replace("BODY", textwrap.dedent(body).strip())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_set_tf32_to_the_state_the_process_has_writes_nothing():
    # a fresh process: matmuls "highest" (no TF32), cuDNN TF32 on; asking for the matmul state it has changes no flag
    seen = probe("""
        torch.backends.cudnn.allow_tf32 = False
        before = flags()
        set_tf32(False)()
        extra = None
    """)
    assert seen["after"] == seen["before"]


@pytest.mark.parametrize("enabled", [True, False])
def test_set_tf32_switches_and_its_restore_puts_back_the_values(enabled):
    seen = probe(f"""
        restore = set_tf32({enabled})
        extra = {{"matmul": torch.get_float32_matmul_precision(), "cudnn": torch.backends.cudnn.allow_tf32}}
        restore()
    """)
    assert seen["extra"] == {"matmul": "high" if enabled else "highest", "cudnn": enabled}
    assert (seen["after"]["matmul"], seen["after"]["cudnn"]) == (seen["before"]["matmul"], seen["before"]["cudnn"])


def test_the_warm_workers_reset_puts_back_a_changed_switch_and_writes_no_other():
    seen = probe("""
        start = read_switches()
        torch.set_num_threads(1)
        torch.backends.cudnn.benchmark = not start["cudnn.benchmark"]
        reset_between_trials(start)
        extra = {"threads": torch.get_num_threads() == start["num_threads"],
                 "benchmark": torch.backends.cudnn.benchmark == start["cudnn.benchmark"]}
    """)
    assert seen["extra"] == {"threads": True, "benchmark": True}
    assert seen["after"] == seen["before"]  # no TF32 switch written: none had changed



@pytest.mark.parametrize("onednn, avx512_bf16, amx, native", [
    (True, False, False, False),  # AVX-512 without its bf16 extension: oneDNN converts, as on AVX2
    (True, True, False, True), (True, False, True, True),
    (False, True, True, False),  # ONEDNN_MAX_CPU_ISA=AVX2 on a bf16 CPU: oneDNN may not use the instructions
])
def test_a_cpu_computes_bf16_natively_only_with_the_instructions_and_onednn_allowed_to_use_them(
        monkeypatch, onednn, avx512_bf16, amx, native):
    import torch
    from perflab import backends
    monkeypatch.setattr(backends, "_onednn_bf16", lambda: onednn)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert backends.bf16_is_native(torch.device("cpu")) is native
