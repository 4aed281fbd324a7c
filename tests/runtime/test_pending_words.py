"""A waiting job's reason: the round stores the words that are not in the job's own columns, readers get
the whole sentence (place and priority added), and a queue that shifts changes positions, not words."""

from __future__ import annotations

from lucid_core.config import LucidConfig
from lucid_core.domain import Job, Pool, Profile, ShareClass
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.round.pending import describe_pending, pending_reasons


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
        f"behind 2 job(s) with a lower priority value; {words}; priority 12 GPU-h (8 x predicted 1.5 h)")
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


def test_the_queue_listing_reads_text_stored_in_number_columns_without_failing(tmp_path):
    """A hand edit (or another controller) can store text where a position or a prediction belongs, and
    SQLite keeps it: `lucid queue` and the pages still list every job, leaving out what is not a number."""
    import time

    from sqlalchemy import text

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces import queries

    store = Store(f"sqlite:///{tmp_path}/q.db")
    now = time.time()
    with store.session() as s:
        for i, position in enumerate((1, 2, 3)):
            s.add(JobRow(job_id=f"j{i}", seq=i + 1, name="n", user="u", vc="v", gpus=2, command="true", env={},
                         state="QUEUED", submit_time=now, pending_reason="no compact fit", queue_position=position,
                         predicted_duration=900.0))
    with store.session() as s:
        s.execute(text("update jobs set queue_position = 'abc', predicted_duration = 'zz' where job_id = 'j1'"))
    rows = {r["job_id"]: r for r in queries.queue(store)}
    assert set(rows) == {"j0", "j1", "j2"}
    assert rows["j1"]["pending_reason"] == "no compact fit" and rows["j1"]["priority_gpu_s"] is None
    assert rows["j2"]["pending_reason"].startswith("behind 2 job(s)")
    store.dispose()


def test_a_job_whose_vc_has_no_host_is_told_so_by_name():
    """A job of a VC no main host serves is tried on the untagged hosts; where those cannot hold it, its
    words name its VC (not an anonymous 'main node' with 0 of 0 GPUs), and jobs of two such VCs that
    share the untagged part keep words of their own."""
    config = LucidConfig()
    view = ClusterView(config)
    view.add_nodes(Pool.MAIN, 1, vc="prod")
    policy = LucidPolicy(config)
    for job_id, vc in (("r", "research"), ("s", "speech"), ("p", "prod")):
        job = Job(job_id, "u", vc, 8, 0.0, profile=Profile(90, 40, 20000), share_class=ShareClass.JUMBO,
                  predicted_duration=60.0)
        view.add_job(job)
        view.enqueue_main(job, (job.priority, job.submit_time, job_id))
    busy = Job("busy", "u", "prod", 8, 0.0, profile=Profile(90, 40, 20000), share_class=ShareClass.JUMBO,
               predicted_duration=36000.0)
    view.add_job(busy)
    view.start("busy", Pool.MAIN, view.main.place_compact(8, "prod"))
    reasons = pending_reasons(view, policy)
    assert "no main host serves VC research" in reasons["r"][1]
    assert "no main host serves VC speech" in reasons["s"][1]
    assert "research" not in reasons["s"][1]
    assert "no compact fit for 8 GPU(s): the largest free block on one main node of VC prod is 0" in reasons["p"][1]
    untagged = ClusterView(config)  # no host carries a VC (a trace replay): a job too wide is told its width
    untagged.add_nodes(Pool.MAIN, 1)
    wide = Job("w", "u", "research", 16, 0.0, profile=Profile(90, 40, 20000), share_class=ShareClass.JUMBO,
               predicted_duration=60.0)
    untagged.add_job(wide)
    untagged.enqueue_main(wide, (wide.priority, wide.submit_time, "w"))
    assert "no compact fit for 16 GPU(s)" in pending_reasons(untagged, policy)["w"][1]


def test_a_job_with_no_main_host_left_says_so():
    """Once the last main host was removed a waiting job read "the largest free block on one main node is 0 (0 of
    0 GPUs free)"; it now says there is none and that it waits for one."""
    config = LucidConfig()
    view = ClusterView(config)
    view.add_nodes(Pool.PROFILING, 1)
    _queued(view, "alone", 600.0, gpus=1)
    words = pending_reasons(view, LucidPolicy(config))["alone"][1]
    assert words.startswith("there is no main host: it waits until one joins (lucid hosts add)"), words
