"""perflab serve: LoadGen scenarios and a dynamic batcher in front of any workload and its levers.

    result = perflab.serve.serve(RunConfig(workload="mlp", device="cpu"), ServeConfig(qps="200,400"), out="runs/x")

schedule (arrivals) -> loadgen (runs a scenario) -> batcher (forms batches off the schedule: virtual arrivals)
-> server (instances run engines) -> metrics (per-query stamps to percentiles); search (max QPS) and capacity
(the harness's own) on top.
pool: the staged sample pool and the batched copies out of it; engine: a model instance; generation: a
generation workload's instance (static batching) whose token times become per-query TTFT/TPOT."""
from perflab.serve.config import SCENARIOS, ServeConfig
from perflab.serve.driver import serve, serve_run_config

__all__ = ["ServeConfig", "serve", "serve_run_config", "SCENARIOS"]
