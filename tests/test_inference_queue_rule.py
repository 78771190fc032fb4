"""The inference-queue rule on recorded serve metrics: a queue-bound tail, under-filled batches, a healthy server."""
from perflab.diagnose import diagnose_result
from perflab.bottlenecks import INFERENCE_QUEUE, NO_CLEAR_BOTTLENECK
from perflab.results import Result


def point(offered, achieved, p99, tail, fill, busy, mean_batch, passed, index=0):
    return {"index": index, "scenario": "server", "offered_qps": offered, "achieved_qps": achieved, "completed": 500,
            "queries": 500, "latency_ms": {"p50": p99 / 3, "p90": p99 / 2, "p95": p99 / 1.5, "p99": p99,
                                           "p99.9": p99 * 1.1, "mean": p99 / 3, "max": p99 * 1.2},
            "time_ms": {"mean": {k: v / 3 for k, v in tail.items()}, "tail": tail}, "batch_fill_pct": fill,
            "batch_mean": mean_batch, "instance_busy_pct": busy, "meets_bound": passed, "passed": passed,
            "harness_late": False, "gpu": {"util_mean_pct": 55.0}, "batch_histogram": {}}


def serve_result(points, max_batch=32, timeout_ms=1.0, ceiling=5000.0, max_qps=None):
    serve = {"scenario": "server", "settings": {"max_batch": max_batch, "batch_timeout_ms": timeout_ms,
                                                "instances": 1, "p99_ms": 15.0},
             "estimated_samples_per_s": ceiling, "points": points, "max_qps": max_qps}
    return Result(config={"device": "cuda", "workload": "resnet50"}, environment={}, workload={}, trials=[],
                  metrics={"serve": serve}, levers=["compile"])


def parts(queue, formation, compute):
    return {"queue_wait": queue, "batch_formation": formation, "dispatch_delay": 0.1, "copy_in": 0.3,
            "compute": compute, "copy_out": 0.2}


def test_queue_wait_dominating_the_tail_is_named_with_numbers_and_remedies():
    overloaded = point(4000, 3100, 80.0, parts(60.0, 0.5, 12.0), fill=97.0, busy=99.0, mean_batch=31.0,
                       passed=False)
    diagnosis = diagnose_result(serve_result([point(2000, 2000, 9.0, parts(1, 1, 6), 60, 60, 19, True),
                                              overloaded], max_qps=3000.0))
    assert diagnosis.bottleneck == INFERENCE_QUEUE and diagnosis.confidence >= 0.7
    assert "queue wait is 82% of the tail" in diagnosis.headline
    assert diagnosis.evidence["offered_qps"] == 4000
    advice = " ".join(diagnosis.advice)
    assert "--batcher-max-batch" in advice and "--instances 2" in advice and "admission control" in advice
    assert "3,000" in advice, "admission control names the max QPS that met the bound"


def test_under_filled_batches_at_a_rate_the_model_could_take_propose_a_longer_timeout():
    starved = point(3000, 2950, 25.0, parts(4.0, 1.0, 18.0), fill=12.0, busy=95.0, mean_batch=3.8, passed=False)
    diagnosis = diagnose_result(serve_result([starved], ceiling=9000.0))
    assert diagnosis.bottleneck == INFERENCE_QUEUE
    assert "under-filled" in diagnosis.headline and "9,000" in diagnosis.headline
    assert any("raise --batch-timeout-ms from 1 to about 5.0" in line for line in diagnosis.advice)


def test_a_server_inside_its_bound_has_no_queue_finding():
    healthy = point(1000, 1000, 6.0, parts(0.2, 0.8, 3.5), fill=40.0, busy=35.0, mean_batch=12.8, passed=True)
    diagnosis = diagnose_result(serve_result([healthy]))
    assert diagnosis.bottleneck == NO_CLEAR_BOTTLENECK and not diagnosis.findings


def test_a_point_where_the_harness_dispatched_late_is_not_blamed_on_the_queue():
    late = point(4000, 3100, 80.0, parts(60.0, 0.5, 12.0), fill=97.0, busy=99.0, mean_batch=31.0, passed=False)
    late["harness_late"] = True
    diagnosis = diagnose_result(serve_result([late]))
    assert diagnosis.bottleneck == NO_CLEAR_BOTTLENECK and not diagnosis.findings


def test_batches_mostly_padding_propose_a_finer_bucket_step():
    starved = point(3000, 2950, 25.0, parts(4.0, 1.0, 18.0), fill=12.0, busy=95.0, mean_batch=3.8, passed=False)
    starved["padded_samples"] = 250  # 250 padded rows beside 500 served queries: a third of the work
    result = serve_result([starved], ceiling=9000.0)
    result.metrics.serve.settings.buckets, result.metrics.serve.settings.bucket_step = [1, 2, 4, 8, 16, 32], 16
    advice = " ".join(diagnose_result(result).advice)
    assert "33% of the samples computed were padding" in advice and "--bucket-step (now 16)" in advice
    result.metrics.serve.points[0].padded_samples = 20  # 4%: not worth more shapes
    assert "--bucket-step" not in " ".join(diagnose_result(result).advice)


def test_poisson_noise_in_the_schedule_is_not_read_as_admission_control():
    """The seeded schedule offered 3,680 queries/s, not its nominal 4,000: the server took all of them, so nothing
    was shed; against the nominal rate, 92% would have looked like a shortfall."""
    queued = point(4000, 3660, 80.0, parts(60.0, 0.5, 12.0), fill=97.0, busy=99.0, mean_batch=31.0, passed=False)
    queued["realised_offered_qps"] = 3680.0
    diagnosis = diagnose_result(serve_result([queued]))
    assert diagnosis.bottleneck == INFERENCE_QUEUE
    assert diagnosis.evidence["realised_offered_qps"] == 3680.0 and diagnosis.evidence["offered_qps"] == 4000
    assert "admission control" not in " ".join(diagnosis.advice)
    queued["achieved_qps"] = 3000.0  # now a real shortfall against what was offered
    assert "admission control: 3,680 queries/s were offered" in " ".join(diagnose_result(serve_result([queued])).advice)
