"""One truth for "shared": two jobs shared a GPU only for the time both of their runs ran on it, by the run
records; a partner that ended inside its profiling window before the other started never shared."""

from __future__ import annotations

import json
import time

import pytest

from lucid_core.cli import main
from lucid_core.domain import JobState, RunState
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.prometheus import render
from lucid_core.runtime.surfaces.queries import status
from lucid_core.runtime.surfaces.shared_time import shared_pairs, shared_spans
from lucid_core.runtime.surfaces.submission import JobRequest, submit


def _run(job: str, run_id: str, partner: str | None, start: float | None, end: float | None,
         gpus: list[int], *, state: str = RunState.ENDED.value, in_place: bool = False) -> RunRow:
    return RunRow(run_id=run_id, host="m0", job_id=job, kind="main", pool="main", gpu_indices=gpus, node_rank=0,
                  partner=partner, profile_in_place=in_place, state=state, planned_at=(start or 0.0) - 1,
                  started_at=start, ended_at=end)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A store whose run records hold: a pair whose partner ended in profiling before the other started
    (a, b), a pair that ran together for 60 s and ended (c, d), and a pair sharing now (e, f)."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=4, workdir=str(tmp_path / "m0")))
    ids = [submit(store, JobRequest("true", gpus=1, user="ana", vc="default", name=f"j{i}")) for i in range(6)]
    a, b, c, d, e, f = ids
    now = time.time()
    with store.session() as s:
        s.add_all([
            _run(b, "rb", a, now - 900, now - 850, [0], in_place=True),  # b ended in its profiling window...
            _run(a, "ra", b, now - 800, None, [0], state=RunState.RUNNING.value),  # ...before a started beside it
            _run(c, "rc", d, now - 700, now - 500, [1]),
            _run(d, "rd", c, now - 560, now - 400, [1]),  # together from -560 to -500: 60 s
            _run(e, "re", f, now - 300, None, [2], state=RunState.RUNNING.value),
            _run(f, "rf", e, now - 200, None, [2], state=RunState.RUNNING.value),
        ])
        for job, state in ((a, JobState.RUNNING), (b, JobState.COMPLETED), (c, JobState.COMPLETED),
                           (d, JobState.COMPLETED), (e, JobState.RUNNING), (f, JobState.RUNNING)):
            row = s.get(JobRow, job)
            row.state = state.value
            row.ended_in_profiling = job == b
            row.end_time = now - 100 if state == JobState.COMPLETED else None
    yield store, url, ids, now
    store.dispose()


def test_pairs_are_counted_only_for_the_time_both_ran(recorded):
    store, _, (a, _b, c, d, e, f), now = recorded
    with store.session() as s:
        pairs = shared_pairs(s, now)
        spans = shared_spans(s, now, [a, c])
    assert set(pairs) == {tuple(sorted((c, d))), tuple(sorted((e, f)))}
    assert pairs[tuple(sorted((c, d)))] == pytest.approx(60.0)
    assert pairs[tuple(sorted((e, f)))] == pytest.approx(200.0)
    assert a not in spans and [x.partner for x in spans[c]] == [d]


def test_status_and_explain_say_the_partner_never_ran_beside_it(recorded, capsys, tmp_path):
    store, url, (a, b, c, d, e, f), _ = recorded
    data = status(store, b)
    assert data["shared_spans"] == [] and "never ran on one GPU at the same time" in data["sharing"]
    assert status(store, a)["sharing"].startswith(f"placed to share with {b}; the two have not run")
    together = status(store, c)
    assert [round(x["seconds"]) for x in together["shared_spans"]] == [60]
    assert together["sharing"] == f"shared a GPU with {d} on m0 GPU 1 for 60 s"
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\nenabled = false\n")
    assert main(["status", b, "--store", url]) == 0
    out = capsys.readouterr().out
    assert "never ran on one GPU" in out and "shared a GPU with" not in out
    assert main(["explain", b, "--store", url, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"placed beside {a}\n" in out and "None" not in out
    assert main(["explain", b, "--store", url, "--config", str(config), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["shared_spans"] == [] and "never ran" in explained["shared_time"]
    assert main(["explain", e, "--store", url, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"shared a GPU with {f} on m0 GPU 2" in out and "(still sharing)" in out


def test_metrics_count_a_gpu_shared_only_while_two_jobs_run_on_it(recorded):
    store, _, (a, *_rest), now = recorded
    with store.session() as s:  # a second job planned on GPU 3 beside a running one: not sharing yet
        s.add_all([_run(a, "ra3", None, now - 50, None, [3], state=RunState.RUNNING.value),
                   RunRow(run_id="rp", host="m0", job_id=_rest[0], kind="main", pool="main", gpu_indices=[3],
                          node_rank=0, state=RunState.PLANNED.value, planned_at=now)])
    text = render(store, now).decode()
    shared = [line for line in text.splitlines() if line.startswith("lucid_gpus{") and 'state="shared"' in line]
    assert len(shared) == 1 and shared[0].endswith(" 1.0"), shared  # only GPU 2 (e and f both run)
