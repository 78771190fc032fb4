"""serve(): build the model after levers, warm every instance, measure the harness's own capacity, then run the
scenario's points (fixed rates, or the max-QPS search), saving result.json after every point; last, where a
lever changes numerics (or --check-quality asks), the quality gate at the max batch, as `perflab run` runs it."""
from __future__ import annotations

import os
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np
import torch

from perflab import options
from perflab.config import RunConfig
from perflab.errors import PerflabError
from perflab.step.data import make_loader
from perflab.harness.progress import Reporter
from perflab.pipeline import (describe_workload, load, new_result, out_of_memory_as_result, prepared, quality_stage,
                              resolve_config, resolve_device, with_breakdown_advice)
from perflab.results.metrics import LoadPoint, Serve, ServeSettings
from perflab.results import Result
from perflab.serve import mlcommons
from perflab.serve.capacity import measure_capacity
from perflab.serve.config import ServeConfig
from perflab.serve.engine import ModelEngine, batch_shapes
from perflab.serve.generation import GenerationEngine, check_generation_serving, load_requests
from perflab.serve.pool import stage_pool
from perflab.serve.session import Session, late_threshold_ms, run_scenario
from perflab.serve.server import Engine, Server
from perflab.workloads import DatasetShorterThanBatch, Workload
from perflab.diagnose import diagnose_result

POOL_SAMPLES = 128  # samples loaded into host memory before the load starts (LoadGen's performance sample set)
ESTIMATE_BATCHES = 3


def serve_run_config(run_cfg: RunConfig, serve_cfg: ServeConfig, workload: Union[Workload, str, None] = None
                     ) -> RunConfig:
    """The run config of a serve session: inference (whatever its mode said), batch size = max batch, device
    resolved."""
    return resolve_config(run_cfg.replace(mode="infer", batch_size=serve_cfg.max_batch), workload)


def _single_query_ms(engine: Engine) -> float:
    """The fastest of a few lone queries: the latency floor no load can beat."""
    times = []
    for _ in range(ESTIMATE_BATCHES):
        began = time.perf_counter()
        engine.serve(np.zeros(1, dtype=int))
        times.append(1000 * (time.perf_counter() - began))
    return min(times)


def _estimate_samples_per_s(engine: Engine, max_batch: int, samples: int) -> float:
    """Samples/s of back-to-back full batches on one instance: where the first rate and query counts start."""
    ids = np.arange(max_batch) % samples
    began = time.perf_counter()
    for _ in range(ESTIMATE_BATCHES):
        engine.serve(ids)
    return ESTIMATE_BATCHES * max_batch / (time.perf_counter() - began)


def _load_pool(workload: Workload, seed: int) -> tuple[Any, int]:
    """The model inputs of the first POOL_SAMPLES samples, stacked (targets are not served)."""
    count = min(POOL_SAMPLES, len(workload.dataset))
    loader = make_loader(workload.dataset, count, 0, False, False, None, workload.collate_fn, seed)
    inputs, _ = next(iter(loader))
    return inputs, count


def serve(run_cfg: RunConfig, serve_cfg: ServeConfig, out: Optional[Union[str, Path]] = None,
          workload: Union[Workload, str, None] = None, engines: Optional[list[Engine]] = None,
          on_point: Callable[[LoadPoint], None] = lambda point: None, command: Optional[list[str]] = None,
          reporter: Optional[Reporter] = None) -> Result:
    """Serve a workload under the scenario of `serve_cfg`; `engines` replaces the model (tests, capacity);
    `reporter` shows the quality gate's progress."""
    serve_cfg.validate()
    if serve_cfg.loadgen:
        mlcommons.bindings()  # one line saying what to install, before any model is built
    cfg = serve_run_config(run_cfg, serve_cfg, workload)
    device = resolve_device(cfg.device)
    saved = cfg.replace(out=str(out)) if out is not None else cfg
    with with_breakdown_advice(saved, device, command), out_of_memory_as_result(saved, device, command):
        return _serve(cfg, serve_cfg, device, out, workload, engines, on_point, command, reporter or Reporter())


def _serve(cfg: RunConfig, serve_cfg: ServeConfig, device, out: Optional[Union[str, Path]],
           workload: Union[Workload, str, None], engines: Optional[list[Engine]], on_point: Callable[[LoadPoint], None],
           command: Optional[list[str]], reporter: Reporter) -> Result:
    try:
        workload = load(workload, cfg)
    except DatasetShorterThanBatch as err:  # a serve session's batch is the batcher's
        raise err.naming(options.option_named(ServeConfig, "max_batch").flag) from None
    if not workload.supports_inference:
        raise PerflabError(f"{workload.name} is a training-only workload: it has no inference mode to serve; "
                           "choose another --workload")
    generates = workload.generation is not None
    if generates:
        check_generation_serving(workload, serve_cfg.instances)
        requests = load_requests(workload, POOL_SAMPLES, device)
        samples = requests.count
    else:
        pool, samples = _load_pool(workload, serve_cfg.sample_seed)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    with ExitStack() as stack:
        prep = stack.enter_context(prepared(workload, cfg, device)) if engines is None else None
        plan = prep.plan if prep is not None else None
        if plan is not None:
            engines = _model_engines(plan, serve_cfg, cfg, generates, requests if generates else None,
                                     None if generates else (pool, samples), notes)
        result = new_result({**cfg.to_dict(), "serve": serve_cfg.to_dict()}, device, describe_workload(workload, None),
                            command, notes=notes, status="interrupted",
                            status_reason="the session stopped before its last point; the finished points are kept")
        stack.enter_context(cpu_threads_for(serve_cfg.instances, device.type))
        if plan is not None:
            result.levers = list(plan.levers)
        server = Server(engines, plan.stepping if plan is not None else nullcontext)
        stack.callback(server.close)
        server.warm_up(cfg.warmup)
        estimate = _estimate_in_thread(server, cfg.batch_size, samples)
        result.metrics.serve = _record_head(serve_cfg, cfg, engines, estimate)
        result.metrics.serve.single_query_ms = _single_query_in_thread(server)
        session = Session(server, cfg, serve_cfg, result, Path(out) if out else None, samples,
                          device.index if device.type == "cuda" else None, on_point)
        session.record.capacity = measure_capacity(cfg.batch_size, serve_cfg.batch_timeout_ms / 1000,
                                                      serve_cfg.instances)
        session.save()
        run_scenario(session, estimate)
        session.record.complete = True
        # NaN/inf outputs make the result invalid, as `perflab run` treats a diverged model (exit 1)
        result.status, result.status_reason = ("invalid", session.non_finite) if session.non_finite else ("complete", "")
        _diagnose(result)
        session.save()
    if prep is not None and prep.pristine is not None:  # after the model is released: the gate builds its own
        result.quality = quality_stage(prep, reporter)  # baseline and candidate
        session.save()
    return result


def _model_engines(plan, serve_cfg: ServeConfig, cfg: RunConfig, generates: bool, requests, pool, notes: list[str]
                   ) -> list[Engine]:
    """The engines that serve the prepared model: one generation engine, or `instances` model engines sharing one
    staged pool of samples."""
    if generates:
        notes.append("generation is served with static batching: a batch of requests is prefilled together and "
                     "decoded to completion (no continuous batching)")
        return [GenerationEngine(plan, requests, cfg.batch_size)]
    inputs, samples = pool
    graphs = cfg.cuda_graphs and plan.device.type == "cuda"
    sizes = batch_shapes(serve_cfg.scenario, cfg.batch_size, serve_cfg.bucket_step) if graphs or cfg.compile else None
    # staged once (memory format, pinned) and shared: instances copy samples straight out of it
    staged = stage_pool(inputs, samples, plan.device, plan.memory_format)
    engines = [ModelEngine(plan, staged, cfg.batch_size, sizes, graphs) for _ in range(serve_cfg.instances)]
    if engines[0].sizes is not None:
        notes.append(f"batches are padded up to {engines[0].sizes} so that only those shapes are "
                     "compiled/captured (in warm-up); padded_samples counts the padding")
    return engines


@contextmanager
def cpu_threads_for(instances: int, device_type: str) -> Iterator[None]:
    """On a CPU, leave a core to the batcher: OpenMP workers spinning on every core starve the instance that wakes
    to dispatch the next batch (its dispatch delay then counts against the model)."""
    if device_type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(before, ((os.cpu_count() or 2) - 1) // instances)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _estimate_in_thread(server: Server, max_batch: int, samples: int) -> float:
    """Every instance serves full batches on its own thread at once (compiled and captured graphs live there)."""
    found: list[float] = []
    serving = server.on_every_instance(
        lambda engine: found.append(_estimate_samples_per_s(engine, max_batch, samples)))
    serving.wait()
    return sum(found)  # the instances ran at once, as they serve


def _single_query_in_thread(server: Server) -> float:
    found: list[float] = []
    server.on_instance(0, lambda engine: found.append(_single_query_ms(engine))).wait()
    return found[0]


def _record_head(serve_cfg: ServeConfig, cfg: RunConfig, engines: list, estimate: float) -> Serve:
    settings = ServeSettings(max_batch=cfg.batch_size, batch_timeout_ms=serve_cfg.batch_timeout_ms,
                             instances=serve_cfg.instances, p99_ms=serve_cfg.p99_ms, duration_s=serve_cfg.duration_s,
                             min_queries=serve_cfg.min_queries, buckets=getattr(engines[0], "sizes", None),
                             bucket_step=serve_cfg.bucket_step, harness_late_ms=late_threshold_ms(serve_cfg))
    return Serve(scenario=serve_cfg.scenario, schedule_seed=serve_cfg.schedule_seed,
                 sample_seed=serve_cfg.sample_seed, settings=settings, estimated_samples_per_s=estimate)


def _diagnose(result: Result) -> None:
    result.diagnosis = diagnose_result(result).to_dict()
