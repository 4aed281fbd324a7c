"""A job on an MPS host that prints the wrapper's start-failure line and exits 97 itself fails as usual (B28).

The round reads exit status 97 with one stderr line beginning "lucid: MPS: " as a daemon that could not
start: the job never ran, so it is requeued and the host cools down. A job could print that line itself and
exit 97: it was requeued although it had run (and would run again), and the host took no work for everyone
else. The wrapper now adds a line of its own when the job exits 97. Real rounds on a local host with the
stand-in MPS control binary of test_mps_hosts.
"""

from __future__ import annotations

import subprocess

import test_mps_hosts as mps_hosts
from runtime_helpers import jobs_by_id
from test_mps_hosts import _cluster, _main_runs, _until

from lucid_core.runtime.hosts.mps import START_FAILED, START_FAILED_WORDS, mps_client_command
from lucid_core.runtime.round.mps_faults import START_RETRY_EVENT
from lucid_core.runtime.store.schema import HostRow, JobEventRow
from lucid_core.runtime.surfaces.submission import JobRequest, submit

live, stand_in = mps_hosts.live, mps_hosts.stand_in  # its fixtures: a store, the stand-in control binary
FORGED = f"echo '{START_FAILED_WORDS}forged by the job' >&2; exit {START_FAILED}"


def test_the_wrapper_marks_the_jobs_own_status_97_so_its_stderr_is_never_one_wrapper_line(tmp_path, stand_in):
    done = subprocess.run(["sh", "-c", mps_client_command(FORGED, str(tmp_path / "runs"), [0], "r1", None)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == START_FAILED  # the job's own status passes through
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0] == f"{START_FAILED_WORDS}forged by the job" and len(lines) == 2


def test_a_job_that_forges_the_start_failure_fails_alone_and_the_host_keeps_taking_work(live, tmp_path, stand_in):
    _cluster(live, tmp_path / "hosts")
    ran = tmp_path / "ran"
    profiling = 'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then sleep 30; exit 0; fi'  # the profiling run waits
    job = submit(live, JobRequest(f"{profiling}; echo ran >> {ran}; {FORGED}", 1, "mallory", "vc-a", name="light-a"))
    jobs = _until(live, lambda j: j[job].state in ("FAILED", "QUEUED", "COMPLETED") and _main_runs(live, job))
    assert jobs[job].state == "FAILED" and jobs[job].exit_code == START_FAILED
    assert ran.read_text().count("ran") == 1  # it ran once and is not run again
    with live.session() as s:
        host = s.get(HostRow, "m0")
        assert host.cooldown_until is None and not (host.last_error or "").startswith("launch refused")
        assert not s.query(JobEventRow).filter_by(job_id=job, kind=START_RETRY_EVENT).all()
    other = submit(live, JobRequest(f"{profiling}; echo fine", 1, "ann", "vc-a", name="light-b"))
    assert _until(live, lambda j: j[other].state == "COMPLETED")[other].state == "COMPLETED"
    assert jobs_by_id(live)[job].state == "FAILED"
