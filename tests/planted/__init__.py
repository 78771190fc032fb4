"""Planted-bottleneck workloads: each file's build(cfg) returns a perflab.Workload with one known bottleneck."""
