"""A stored footprint that is no finite number fails no round on an MPS host (B28).

A main run there is an MPS client whose pinned device memory is its profiled footprint plus headroom; a
footprint of Infinity (PostgreSQL's float, or another controller's write) made math.ceil raise OverflowError
out of the launch, so every round failed while the job waited, and NaN failed the job's launch. Neither is a
footprint: the run gets no limit, as a job not profiled yet. Real rounds on a local host with the stand-in
MPS control binary of test_mps_hosts.
"""

from __future__ import annotations

import time

import pytest
import test_mps_hosts as mps_hosts
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, runs_of
from sqlalchemy import update

from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.mps import memory_limit_mb, pinned_limit
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import JobRow
from lucid_core.runtime.surfaces.submission import JobRequest, submit

live, stand_in = mps_hosts.live, mps_hosts.stand_in  # its fixtures: a store, the stand-in control binary


@pytest.mark.parametrize("footprint", [float("inf"), float("-inf"), float("nan"), None, 0.0, -5.0])
def test_a_footprint_that_is_no_finite_positive_number_gives_no_limit(footprint):
    assert memory_limit_mb(footprint, 512.0) is None
    assert pinned_limit(1, float("inf")) is None and pinned_limit(2, float("nan")) is None
    assert memory_limit_mb(1000.0, float("nan")) == 1000.0


@pytest.mark.parametrize("footprint", [float("inf"), float("nan")], ids=["infinity", "nan"])
def test_a_job_whose_stored_footprint_is_not_finite_runs_without_a_limit_and_breaks_no_round(
        live, tmp_path, stand_in, footprint):
    mps_hosts._cluster(live, tmp_path / "hosts")
    odd = submit(live, JobRequest(f"{mps_hosts.PRINT_ENV}; sleep 1", 1, "dana", "vc-a", name="light-a"))
    plain = submit(live, JobRequest("sleep 1", 1, "ann", "vc-a", name="light-b"))
    with live.session() as s:  # profiled, as another controller wrote it
        s.execute(update(JobRow).where(JobRow.job_id == odd).values(profiled=True, gpu_util=10.0, mem_util=3.0,
                                                                     gpu_mem_mb=footprint))
    config = fast_config(**{"profiler.enabled": False})
    deadline = time.monotonic() + 40
    while True:
        report = SchedulingRound(live, local_executor(), config, SETTINGS,
                                 emulated_profile=lambda job: mps_hosts.LIGHT).run()
        assert not report.errors, report.errors
        jobs = jobs_by_id(live)
        if all(row.state in ("COMPLETED", "FAILED", "CANCELLED") for row in jobs.values()):
            break
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)
    assert jobs[odd].state == jobs[plain].state == "COMPLETED"
    (run,) = [r for r in runs_of(live, odd) if r.kind == "main"]
    out = (tmp_path / "hosts" / run.host / run.run_id / "stdout.log").read_text()
    assert "CUDA_MPS_PIPE_DIRECTORY=" in out and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in out
