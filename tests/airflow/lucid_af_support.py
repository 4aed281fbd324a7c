"""Helpers shared by the Airflow tests (imported by name: tests/airflow is on sys.path under pytest)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TRACE = REPO / "include" / "sample" / "trace.csv"


def seed_finished_jobs(url: str, *, scale: float = 1.0, gpus: int | None = None, limit: int | None = None,
                       offset_s: float = 0.0, prefix: str = "") -> int:
    """Write the sample trace's jobs into the store as finished jobs with emulated profiles."""
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.traces import read_trace

    trace = read_trace(SAMPLE_TRACE, "generic")
    records = trace.records[:limit] if limit else trace.records
    workloads = WorkloadCatalog.synthetic(7).assign(records, seed=7)
    base = trace.epoch.timestamp() + offset_s
    store = Store(url)
    with store.session() as session:
        seq0 = (session.query(JobRow).count() or 0) + 1
        for k, (rec, w) in enumerate(zip(records, workloads, strict=True)):
            submit = base + rec.submit_time
            start = submit + 30.0
            session.add(JobRow(job_id=prefix + rec.job_id, seq=seq0 + k, name=rec.name, user=rec.user, vc=rec.vc,
                               gpus=gpus or rec.gpus, command="true", env={}, state=rec.state or "COMPLETED",
                               submit_time=submit, start_time=start, end_time=start + rec.duration * scale,
                               profiled=True, gpu_util=w.gpu_util, mem_util=w.mem_util, gpu_mem_mb=w.gpu_mem_mb,
                               profile_emulated=True, amp=w.amp))
    store.dispose()
    return len(records)
