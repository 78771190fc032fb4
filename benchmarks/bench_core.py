"""Area "core": the measurement core on the GPU (issue 2).

- calibrate this machine's ceilings;
- driving train and resnet50 infer/train at several batch sizes through perflab.run;
- a bare hand-written loop over the same resnet50 step and the same pre-staged batches: perflab's
  throughput must be within 3% of it, and the spread over 5 trials under 2%.
"""
from __future__ import annotations

import time

import torch
from torchvision.models import resnet50

import perflab
from benchmarks.common import Rows, parse_args
from perflab.calibrate import calibrate
from perflab.backends import set_tf32


def bare_resnet50(mode: str, batch: int, steps: int, trials: int, warmup: int, device) -> list[float]:
    """The simplest honest loop: same model, same 4 distinct device batches, sync only at the ends."""
    torch.manual_seed(0)
    model = resnet50(weights=None).to(device).train(mode == "train")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = [(torch.randn(batch, 3, 224, 224, device=device), torch.randint(0, 1000, (batch,), device=device))
               for _ in range(4)]

    def step(i: int) -> None:
        images, labels = batches[i % 4]
        if mode == "train":
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model(images)

    with torch.inference_mode(mode == "infer"):
        for i in range(warmup):
            step(i)
        torch.cuda.synchronize()
        throughputs = []
        for _ in range(trials):
            torch.cuda.synchronize()
            began = time.perf_counter()
            for i in range(steps):
                step(i)
            torch.cuda.synchronize()
            throughputs.append(steps * batch / (time.perf_counter() - began))
    return throughputs


def main() -> None:
    args = parse_args()
    rows = Rows("core", args.out)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    entry = calibrate(device, quick=args.quick or not cuda)
    for precision, tflops in entry["tflops"].items():
        rows.add("calibrate", f"matmul {precision}", tflops, "TFLOP/s", f"{entry['matmul_size']}^3")
    rows.add("calibrate", "device memory copy", entry["memory_gbps"], "GB/s", "read+write")
    for key in ("h2d_pinned_gbps", "h2d_pageable_gbps"):
        if key in entry:
            rows.add("calibrate", key, entry[key], "GB/s")

    steps, trials, warmup = (30, 5, 10) if cuda and not args.quick else (3, 2, 1)
    image = {} if cuda else {"image_res": "32"}
    # driving's loader decodes 8 JPEGs per sample on the host: fewer steps keep the area short.
    plan = [("driving", "train", [16, 32] if cuda else [2], {"workers": 8, "steps": 10, "trials": 3})]
    plan += [("resnet50", "infer", [32, 128, 256] if cuda else [2], {}),
             ("resnet50", "train", [32, 128] if cuda else [2], {})]
    for workload, mode, batches, extra in plan:
        for batch in batches:
            out = args.out / f"{workload}-{mode}-bs{batch}"
            settings = {"steps": steps, "trials": trials, "warmup": warmup, **(extra if cuda else {})}
            cfg = perflab.RunConfig(workload=workload, mode=mode, batch_size=batch, workload_options=dict(image),
                                    out=str(out), **settings)
            result = perflab.run(workload, cfg)
            out.mkdir(parents=True, exist_ok=True)
            result.save(out)
            tp = result.metrics.throughput_samples_per_s
            phases = result.metrics.phase_share_pct
            top = max(phases, key=phases.get)
            mfu = result.metrics.flops.mfu_pct
            rows.add(f"{workload} {mode} bs{batch}", "throughput", tp.median, "samples/s",
                     f"spread {tp.range_pct:.2f}% · p95 {result.metrics.latency_ms.p95:.2f} ms · "
                     f"MFU {mfu if mfu is None else round(mfu, 1)}% · top phase {top} {phases[top]:.0f}%")

    if not cuda:
        return
    restore = set_tf32(False)  # perflab's fp32 is strict fp32; the bare loop must match it
    try:
        for mode, batch in (("train", 128), ("infer", 256)):
            cfg = perflab.RunConfig(workload="resnet50", mode=mode, batch_size=batch, steps=steps, trials=5,
                                    warmup=warmup)
            ours = perflab.run("resnet50", cfg).metrics.throughput_samples_per_s
            bare = bare_resnet50(mode, batch, steps, 5, warmup, device)
            bare_median = sorted(bare)[2]
            overhead = (bare_median - ours["median"]) / bare_median * 100
            rows.add(f"resnet50 {mode} bs{batch} perflab vs bare", "perflab overhead", overhead, "%",
                     f"perflab {ours['median']:.1f} (spread {ours['range_pct']:.2f}%) vs bare {bare_median:.1f} "
                     f"samples/s (spread {(max(bare) - min(bare)) / bare_median * 100:.2f}%)")
    finally:
        restore()


if __name__ == "__main__":
    main()
