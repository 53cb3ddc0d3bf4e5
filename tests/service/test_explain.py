"""Reasons in a job's events: every rescale and batch-size change says why."""

from __future__ import annotations

from pollux.models import GradientStats, JobHints, ThroughputParams
from pollux.models.typed import TypeProfile
from pollux.service.loop.explain import batch_change_reason, rescale_reason
from pollux.service.storage.states import JobState
from tests.service.service_builders import make_spec
from tests.service.service_test_policies import EqualSharePolicy

# synchronization (alpha_r = 59 ms) dwarfs compute (1 ms per step): one replica wins
SYNC_BOUND = ThroughputParams(alpha_c=0.001, beta_c=1e-6, alpha_n=0.1, beta_n=0.001,
                              alpha_r=0.059, beta_r=0.001, gamma=1.0)


def hints(batch_size: int = 32, local_bsz: int = 32, **fields: object) -> JobHints:
    data = dict(init_batch_size=32, max_batch_size=512, local_bsz_bounds=(8, 128),
                accumulation=True, throughput_params=SYNC_BOUND,
                grad_stats=GradientStats(sqr=1.0, var=0.5), batch_size=batch_size,
                local_bsz=local_bsz, accum_steps=0)
    data.update(fields)
    return JobHints(**data)  # type: ignore[arg-type]


def test_a_shrink_that_helps_the_job_names_sync_and_compute_times() -> None:
    text = rescale_reason(hints(), ["n1", "n1"], ["n1"], num_other_jobs=0)
    assert text.startswith("1 replica has the higher goodput: ")
    assert "samples/s" in text and "sync 59 ms vs compute" in text, text


def test_a_grow_and_a_share_and_no_profile() -> None:
    fast = ThroughputParams(0.05, 0.001, 0.001, 0.0, 0.001, 0.0, 1.0)
    assert rescale_reason(hints(throughput_params=fast), ["n1"], ["n1", "n1"], 0).startswith(
        "predicted goodput ")
    assert rescale_reason(hints(throughput_params=fast), ["n1", "n1"], ["n1"], 2).startswith(
        "shared with 2 other jobs")
    assert "linear speedup" in rescale_reason(None, ["n1"], ["n1", "n1"], 0)
    assert rescale_reason(None, ["n1"], [], 1) == "preempted for other jobs"


def test_a_move_between_gpu_types_names_both() -> None:
    types = {"a-0": "a", "b-0": "b", "a-1": "a"}
    one_type = hints(gpu_type="a", type_profiles={"a": TypeProfile(SYNC_BOUND, 1)})
    assert rescale_reason(one_type, ["a-0"], ["b-0"], 0, types) == (
        "moved from GPU type a to b (no profile on b yet)")
    assert rescale_reason(None, ["a-0"], ["b-0"], 0, types) == (
        "moved from GPU type a to b (no profile on b yet)")
    slower = ThroughputParams(0.004, 4e-6, 0.1, 0.001, 0.059, 0.001, 1.0)
    both = hints(gpu_type="a", type_profiles={"a": TypeProfile(SYNC_BOUND, 1),
                                              "b": TypeProfile(slower, 1)})
    text = rescale_reason(both, ["a-0"], ["b-0"], 0, types)
    assert text.startswith("moved from GPU type a to b (predicted goodput ")
    old, new = (float(v.replace(",", "")) for v in
                text.split("goodput ")[1].split(" samples/s")[0].split(" -> "))
    assert new < old  # b is slower per step
    # within one type (or untyped) the reasons are those of a rescale
    assert rescale_reason(both, ["a-0"], ["a-0", "a-1"], 0, types).startswith(
        "predicted goodput ")


def test_batch_change_reason_compares_goodputs() -> None:
    text = batch_change_reason(hints(batch_size=128, local_bsz=128), 1, 1, old_batch_size=32)
    assert "samples/s at batch 32 on 1 replica" in text and "noise scale 16 samples" in text


def test_rescale_and_batch_events_carry_their_reasons(make_service, fake_backend) -> None:
    service = make_service(policy=EqualSharePolicy.__module__ + ":EqualSharePolicy")
    job = service.submit(make_spec("a", max_replicas=4).to_dict())
    job_id = job["id"]
    service.allocator.tick(1.0)
    service.allocator.tick(2.0)
    assert service.store.get_job(job_id).state is JobState.RUNNING
    service.post_hints(job_id, hints().to_dict())
    service.post_hints(job_id, hints(batch_size=128, local_bsz=32).to_dict())
    service.submit(make_spec("b", max_replicas=4).to_dict())  # a shrinks to share
    service.allocator.request_round()
    service.allocator.tick(3.0)
    events = {e.kind: e.message for e in service.store.events(job_id)}
    assert events["Batch size"].startswith("batch size 32 -> 128: goodput "), events
    assert "samples/s" in events["Rescaling"] and "rescale 4 -> 2 replicas: " in events[
        "Rescaling"], events
