"""The Update Engine on what jobs, users and a second controller can leave in the store and the registry:
each odd row or file fails alone (or is said), and no run leaves the next one failing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lucid_core.update import extract_batch, validate_batch


def seed_jobs(url: str, count: int = 40, *, now: float | None = None, edit=None) -> float:
    """`count` finished jobs of four users, one every 10 minutes over the last hours, then `edit(index, row)`
    on each row before it is written; returns the time the window ends."""
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    now = time.time() if now is None else now
    store = Store(url)
    with store.session() as session:
        for k in range(count):
            submit = now - (count + 1) * 600.0 + k * 600.0
            row = JobRow(job_id=f"job{k}", seq=k + 1, name=f"train-{k % 5}", user=f"user{k % 4}", vc="vc1",
                         gpus=1 + k % 4, command="true", env={}, state="COMPLETED", submit_time=submit,
                         start_time=submit + 10.0, end_time=submit + 10.0 + 600.0 + 97.0 * (k % 13), profiled=True,
                         gpu_util=50.0, mem_util=30.0, gpu_mem_mb=1000.0, profile_emulated=True, amp=False)
            if edit is not None:
                edit(k, row)
            session.add(row)
    store.dispose()
    return now


def test_jobs_cancelled_while_queued_count_as_submissions_not_as_bad_rows(tmp_path: Path):
    """A job cancelled before it started has no start time: 10% of such jobs (users cancel queued jobs) were
    quarantined as bad rows, above the 5% allowed, and training was refused."""
    url = f"sqlite:///{tmp_path / 'lucid.db'}"

    def cancel_some(k, row) -> None:
        if k % 10 == 3:
            row.state, row.start_time, row.end_time = "CANCELLED", None, row.submit_time + 60.0

    now = seed_jobs(url, edit=cancel_some)
    batch = extract_batch(url, tmp_path / "batch", "full", now, full_days=30)
    assert (batch.job_rows, batch.unstarted_rows, batch.slot_rows) == (36, 4, 40)
    checked = validate_batch(batch)
    assert checked["refused"] == ""
    assert checked["job_log"]["quarantined_rows"] == 0


def test_text_in_a_number_column_quarantines_its_row_and_fails_no_run(tmp_path: Path):
    """SQLite keeps text a hand edit puts in a Float column: one such end time failed every later Update Engine
    run in its first task (str - float), before validation could quarantine the row."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    now = seed_jobs(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET end_time = 'abc' WHERE job_id = 'job3'"))
        conn.execute(sa.text("UPDATE jobs SET gpus = 'two' WHERE job_id = 'job5'"))
    engine.dispose()
    checked = validate_batch(extract_batch(url, tmp_path / "batch", "full", now + 1, full_days=30))
    assert checked["refused"] == ""
    assert checked["job_log"]["quarantined_rows"] == 2 and checked["job_log"]["clean_rows"] == 38


def test_a_completed_job_without_a_start_is_still_quarantined(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'lucid.db'}"

    def break_one(k, row) -> None:
        if k == 7:
            row.start_time = None

    now = seed_jobs(url, edit=break_one)
    checked = validate_batch(extract_batch(url, tmp_path / "batch", "full", now, full_days=30))
    assert checked["job_log"]["quarantined_rows"] == 1


def test_users_and_names_that_read_like_missing_values_or_line_breaks_stay_in_their_rows(tmp_path: Path):
    """A user called "NA" (pandas' default reads "NA", "None", "null" as missing: every job of theirs was
    quarantined, and training refused) and a name holding a carriage return (written bare: the batch file's
    rows came apart and the whole batch failed)."""
    url = f"sqlite:///{tmp_path / 'lucid.db'}"

    def odd_text(k, row) -> None:
        if k % 4 == 0:
            row.user = "NA"
        if k % 8 == 1:
            row.user = "None"
        if k == 5:
            row.name = 'sweep\rlr=0.1, "b"\nrun'
        if k == 6:
            row.job_id = "null"

    now = seed_jobs(url, edit=odd_text)
    checked = validate_batch(extract_batch(url, tmp_path / "batch", "full", now, full_days=30))
    assert checked["refused"] == ""
    assert (checked["job_log"]["rows"], checked["job_log"]["quarantined_rows"]) == (40, 0)
    from lucid_core.update import read_batch_frame

    clean = read_batch_frame(checked["job_log"]["clean_path"])
    assert (clean["user"] == "NA").sum() == 10 and (clean["user"] == "None").sum() == 5
    assert clean.loc[clean["job_id"] == "job5", "name"].item() == 'sweep\rlr=0.1, "b"\nrun'
    assert "null" in set(clean["job_id"])


@pytest.mark.parametrize(("count", "edit", "too_few"), [
    (10, None, True),  # a new fleet: only the row counts fail
    (10, lambda k, row: setattr(row, "gpu_util", 150.0) if k < 3 else None, False),  # and bad rows besides
    (40, lambda k, row: setattr(row, "gpu_util", 150.0) if k < 10 else None, False),  # enough rows, bad ones
])
def test_a_batch_refused_only_for_too_few_rows_says_so_and_bad_data_does_not(tmp_path: Path, count, edit, too_few):
    """The Update Engine skips training on a batch short of rows and fails it on bad data: validation says which
    (both failed the run alike, every day on a new fleet), and only bad data's refusal is one the alert mails."""
    from lucid_core.update import refused_for_bad_data

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    now = seed_jobs(url, count, edit=edit)
    batch = extract_batch(url, tmp_path / "batch", "full", now, full_days=30)
    checked = validate_batch(batch)
    assert checked["refused"] and checked["too_few_rows"] is too_few, checked["refused"]
    refusal = refused_for_bad_data(batch.to_dict())
    assert (refusal is None) is too_few
    if refusal is not None:
        assert refusal == (tmp_path / "batch" / "validation.json", checked["refused"])


def _entry(version: int) -> dict:
    """An evaluation entry as train_and_evaluate writes it, for a candidate at `version`."""
    return {"candidate_version": version, "candidate_mae": 0.5, "candidate_errors": [0.4, 0.6], "fit_seconds": 1.0,
            "train_rows": 30, "recent_rows": 8, "training_window": ["0", "1"],
            "reference_inputs": {"gpus": [1.0, 2.0]}}


def _register_both(registry) -> int:
    """A new version of each Update Engine model (a plain object stands for the model); its number."""
    for name in ("duration", "throughput"):
        version = registry.register(name, {"stands for": name}, kind=name, training_window=("0", "1"),
                                    data_hash="", metrics={}).version
    return version


def _active(url: str) -> dict[str, str]:
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.queries import model_versions

    store = Store(url)
    try:
        return {v.kind: v.version for v in model_versions(store) if v.active}
    finally:
        store.dispose()


def test_a_promotion_whose_store_commit_fails_moves_no_registry_pointer(store_url: str, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """The pointers moved before the store's rows committed: a commit that failed (the task killed, the database
    gone) left them naming versions the live round never served and the store never recorded, and the next run
    compared its candidates with those, without a drift reference (no drift check at all)."""
    import lucid_core.runtime.store.store as store_module
    from lucid_core.models.registry import ModelRegistry
    from lucid_core.runtime.store.store import Store
    from lucid_core.update import promote_or_keep, registry_root, served_version

    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    Store(store_url).dispose()
    registry = ModelRegistry(registry_root())
    first = _register_both(registry)
    promote_or_keep(store_url, {"run_id": "r1", "models": {k: _entry(first) for k in ("duration", "throughput")}})
    second = _register_both(registry)
    recorded = store_module.record_promotion

    def dies_at_the_second(session, kind, *args, **kwargs) -> None:
        if kind == "throughput_forecaster":
            raise ConnectionError("the database went away")
        recorded(session, kind, *args, **kwargs)

    monkeypatch.setattr(store_module, "record_promotion", dies_at_the_second)
    with pytest.raises(ConnectionError):
        promote_or_keep(store_url, {"run_id": "r2", "models": {k: _entry(second) for k in ("duration", "throughput")}})
    assert _active(store_url) == {"duration": str(first), "throughput_forecaster": str(first)}
    assert registry.promoted_version("duration") == first and registry.promoted_version("throughput") == first
    assert served_version(store_url, registry, "duration") == first


def test_the_next_run_compares_with_the_version_the_store_serves(store_url: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """A pointer left ahead of the store (by a run that died between the two, before the order was fixed) is
    set back to the version the live round serves, and that version is the one candidates are compared with."""
    from lucid_core.models.registry import ModelRegistry
    from lucid_core.runtime.store.store import Store
    from lucid_core.update import promote_or_keep, registry_root, served_version

    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    Store(store_url).dispose()
    registry = ModelRegistry(registry_root())
    first = _register_both(registry)
    promote_or_keep(store_url, {"run_id": "r1", "models": {"duration": _entry(first)}})
    registry.promote("duration", _register_both(registry))
    assert served_version(store_url, registry, "duration") == first
    assert registry.promoted_version("duration") == first
    assert served_version(store_url, registry, "throughput") is None  # nothing promoted, nothing served


def _trained_run(url: str, directory: Path, now: float, run_id: str) -> dict:
    """extract, validate, train_and_evaluate and promote_or_keep over the last 30 days."""
    from lucid_core.update import promote_or_keep, train_and_evaluate

    checked = validate_batch(extract_batch(url, directory, "full", now, full_days=30))
    assert checked["refused"] == "", checked["refused"]
    return promote_or_keep(url, train_and_evaluate(url, checked, 0.2, run_id))


@pytest.fixture(scope="module")
def promoted_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A store of 40 finished jobs and a registry after one Update Engine run promoted both models."""
    root = tmp_path_factory.mktemp("promoted")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LUCID_HOME", str(root / "home"))
        url = f"sqlite:///{root / 'lucid.db'}"
        now = seed_jobs(url)
        decisions = _trained_run(url, root / "b1", now, "r1")["decisions"]
    assert decisions["duration"]["action"] == "promote"
    return root, now


@pytest.mark.parametrize("damage", ["cut short", "missing", "another object", "pointer text", "odd folder"])
def test_a_promoted_artifact_or_pointer_gone_bad_fails_no_later_run(promoted_once: tuple[Path, float],
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    damage: str):
    """Every later run failed at loading the promoted model (EOFError, FileNotFoundError), reading its pointer
    ("v1": ValueError) or listing the versions (a folder "v²"); the live round serves the history fallback in
    place of an unreadable artifact, so the candidate is judged as if nothing were promoted, and says so."""
    import shutil

    import joblib

    from lucid_core.update import drift_reports, registry_root

    shutil.copytree(promoted_once[0], tmp_path / "copy")
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "copy" / "home"))
    url = f"sqlite:///{tmp_path / 'copy' / 'lucid.db'}"
    folder = registry_root() / "duration"
    artifact = folder / "v0001" / "model.joblib"
    if damage == "cut short":
        artifact.write_bytes(artifact.read_bytes()[:200])
    elif damage == "missing":
        artifact.unlink()
    elif damage == "another object":
        joblib.dump({"not": "a model"}, artifact)
    elif damage == "pointer text":
        (folder / "PROMOTED").write_text("v1\n")
    else:
        (folder / "v²").mkdir()
    second = _trained_run(url, tmp_path / "b2", promoted_once[1], "r2")
    entry, decision = second["evaluation"]["models"]["duration"], second["decisions"]["duration"]
    if damage in ("pointer text", "odd folder"):  # the store still names v1: compared with it as before
        assert entry["promoted_version"] == 1 and "promoted_mae" in entry
    else:
        assert entry["promoted_unreadable"].startswith("promoted version 1 is unreadable")
        assert decision["action"] == "keep" or "is unreadable" in decision["why"]
    drift_reports(second, 1.25, 0.2)


def test_a_drift_reference_of_odd_types_in_the_store_fails_no_drift_check(promoted_once: tuple[Path, float],
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    """The drift reference is JSON in the store's model_versions: text, nulls or nested lists in it (another
    writer's) raised in drift_reports at every later run, and the other model's drift went unchecked with it."""
    import shutil

    import sqlalchemy as sa

    from lucid_core.runtime.store.schema import ModelVersionRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.update import drift_reports, train_and_evaluate

    shutil.copytree(promoted_once[0], tmp_path / "copy")
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "copy" / "home"))
    url = f"sqlite:///{tmp_path / 'copy' / 'lucid.db'}"
    odd = {"duration": {"reference_errors": [0.1, "x", None], "reference_inputs": [1, 2]},
           "throughput_forecaster": {"reference_inputs": {"submit_gpu_job": [None, "NaN"]}}}
    store = Store(url)
    with store.session() as session:
        for row in session.scalars(sa.select(ModelVersionRow).where(ModelVersionRow.active.is_(True))):
            row.metrics = dict(row.metrics) | odd[row.kind]
    store.dispose()
    checked = validate_batch(extract_batch(url, tmp_path / "b2", "full", promoted_once[1], full_days=30))
    evaluation = train_and_evaluate(url, checked, 0.2, "r2")
    reports = drift_reports({"evaluation": evaluation, "decisions": {}}, 1.25, 0.2)
    assert [r["model"] for r in reports] == ["throughput"]  # duration's errors unreadable: no reference to judge
    assert not reports[0]["shifts"]  # its inputs unreadable: none compared


def test_stored_reference_values_are_taken_only_as_finite_numbers():
    from lucid_core.update import finite_numbers, reference_inputs

    assert finite_numbers([1, 2.5, float("nan"), float("inf")]) == [1.0, 2.5]
    assert finite_numbers("abc") == [] and finite_numbers([1, True]) == [] and finite_numbers([[1], [2]]) == []
    assert reference_inputs({"gpus": [1, 2], "hour": [None], "util": "x"}) == {"gpus": [1.0, 2.0]}
    assert reference_inputs([1, 2]) == {}


def test_an_integer_past_a_floats_range_in_a_stored_reference_is_left_out():
    """JSON (and both stores) keep 10**400 as an integer: float() of it raised OverflowError, failing every
    later Update Engine run before any model was trained."""
    from lucid_core.update import finite_numbers, reference_inputs, reference_spread

    assert finite_numbers([1, 10**400, 2.0]) == [1.0, 2.0]
    assert reference_inputs({"gpus": [10**400], "hour": [3, 10**400]}) == {"hour": [3.0]}
    assert reference_spread({"gpus": 10**400, "hour": 0.1, "util": -1}) == {"hour": 0.1}


def _within(seconds: float, call) -> tuple[bool, object]:
    """(finished, result) of `call()` run on a daemon thread given `seconds` (a hang leaves the thread behind)."""
    import threading

    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), out[0] if out else None)


@pytest.mark.parametrize("link", [False, True])
def test_a_promoted_model_path_that_is_a_fifo_leaves_the_round_on_the_fallback(store_url: str, tmp_path: Path,
                                                                                link: bool, monkeypatch):
    """A model_versions row (or the registry's model file) naming a FIFO, or a link to one: joblib.load blocked
    on it for ever, and every live round with it."""
    import os

    from lucid_core.config import LucidConfig
    from lucid_core.runtime.round.live_models import policy_models
    from lucid_core.runtime.round.snapshot import load_snapshot
    from lucid_core.runtime.store.store import Store, record_promotion

    monkeypatch.setenv("LUCID_HOME", str(tmp_path))  # a round loads artifacts from LUCID_HOME/models only
    (tmp_path / "models").mkdir()
    fifo = tmp_path / "models" / "model.fifo"
    os.mkfifo(fifo)
    path = tmp_path / "models" / "model.joblib"
    if link:
        path.symlink_to(fifo)
    store = Store(store_url)
    try:
        with store.session() as session:
            record_promotion(session, "duration", "1", str(path if link else fifo), {}, "by hand", time.time())
        snapshot = load_snapshot(store, time.time())
        finished, models = _within(20.0, lambda: policy_models(LucidConfig(), snapshot))
    finally:
        store.dispose()
    assert finished, "the round hung loading the promoted model"
    assert models[3]["duration"].startswith("history of"), models[3]
    assert "not a regular file" in models[3]["refused"], models[3]  # refused by the FIFO check, not the root


def test_a_registry_model_file_replaced_by_a_fifo_is_unreadable_not_a_hang(tmp_path: Path):
    import os

    from lucid_core.models.registry import ModelRegistry

    registry = ModelRegistry(tmp_path / "registry")
    registry.register("duration", {"a": 1}, kind="duration", training_window=("0", "1"), data_hash="", metrics={})
    artifact = tmp_path / "registry" / "duration" / "v0001" / "model.joblib"
    assert registry.load("duration", 1) == {"a": 1}
    artifact.unlink()
    os.mkfifo(artifact)

    def refused() -> str:
        try:
            registry.load("duration", 1)
        except ValueError as exc:
            return str(exc)
        return "loaded"

    finished, said = _within(20.0, refused)
    assert finished, "loading the registry's model file hung"
    assert "is not a regular file" in str(said)
