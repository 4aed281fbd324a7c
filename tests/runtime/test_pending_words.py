"""A waiting job's reason: the round stores the words that are not in the job's own columns, readers get
the whole sentence (place and priority added), and a queue that shifts changes positions, not words."""

from __future__ import annotations

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile, ShareClass
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.pending import describe_pending, pending_reasons


def _queued(view: ClusterView, job_id: str, predicted: float, gpus: int = 8) -> Job:
    job = Job(job_id, "u", "vc", gpus, 0.0, profile=Profile(90, 40, 20000), share_class=ShareClass.JUMBO,
              predicted_duration=predicted)
    view.add_job(job)
    view.enqueue_main(job, (job.priority, job.submit_time, job_id))
    return job


def _full_view() -> tuple[ClusterView, LucidPolicy]:
    config = LucidConfig()
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1)
    busy = Job("busy", "u", "vc", 8, 0.0, profile=Profile(90, 40, 20000), share_class=ShareClass.JUMBO,
               predicted_duration=36000.0)
    view.add_job(busy)
    view.start("busy", Pool.MAIN, view.main.place_compact(8))
    return view, LucidPolicy(config)


def test_a_queue_that_shifts_keeps_each_jobs_words_and_moves_its_position():
    view, policy = _full_view()
    _queued(view, "a", 3600.0)
    _queued(view, "b", 7200.0)
    before = pending_reasons(view, policy)
    _queued(view, "first", 60.0)  # a shorter job arrives: it goes ahead of both
    after = pending_reasons(view, policy)
    assert [after[j][0] for j in ("first", "a", "b")] == [1, 2, 3]
    assert [before[j][0] for j in ("a", "b")] == [1, 2]
    assert after["a"][1] == before["a"][1] and after["b"][1] == before["b"][1]
    assert "behind" not in after["b"][1] and "priority" not in after["b"][1]
    assert "no compact fit for 8 GPU(s)" in after["b"][1]


def test_readers_get_the_place_and_the_priority_back():
    words = "no compact fit for 8 GPU(s): the largest free block on one main node is 0 (0 of 8 GPUs free)"
    assert describe_pending("QUEUED", 3, words, 8, 5400.0) == (
        f"behind 2 job(s) with a lower priority value; {words}; priority 12.000 GPU-h (8 x predicted 5400 s)")
    assert describe_pending("QUEUED", 1, words, 2, None) == words  # at the head, not predicted yet
    profiling = "waiting for the profiling pool: a smaller job ahead did not fit, the scan stopped there"
    assert describe_pending("SUBMITTED", 4, profiling, 1, None) == (
        f"{profiling}; 3 job(s) ahead in least-GPU-first order")
    assert describe_pending("SUBMITTED", 1, profiling, 1, None) == profiling
    assert describe_pending("RUNNING", None, None, 1, 60.0) is None


def test_a_reason_stored_whole_by_an_earlier_version_is_shown_as_it_is():
    """Until a round rewrites it, a row keeps the whole sentence an earlier version stored: readers must
    not add the place and the priority a second time."""
    whole = ("behind 2 job(s) with a lower priority value; sharing is off (x); "
             "priority 0.500 GPU-h (2 x predicted 900 s)")
    assert describe_pending("QUEUED", 3, whole, 2, 900.0) == whole
    head = "sharing is off (x); priority 0.500 GPU-h (2 x predicted 900 s)"
    assert describe_pending("QUEUED", 1, head, 2, 900.0) == head
    profiling = ("waiting for the profiling pool: a smaller job ahead did not fit, the scan stopped there; "
                 "3 job(s) ahead in least-GPU-first order")
    assert describe_pending("SUBMITTED", 4, profiling, 1, None) == profiling
