"""The round consults the models the Update Engine promoted (model_versions), else refits fallbacks."""

from __future__ import annotations

import time

import joblib
import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.runtime.round.live_models import default_policy
from lucid_core.runtime.round.snapshot import load_snapshot
from lucid_core.runtime.store.schema import ModelVersionRow
from lucid_core.runtime.store.store import Store


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    """LUCID_HOME in the test's folder: a round loads artifacts only from its models/ folder."""
    monkeypatch.setenv("LUCID_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()


class Wrapped:
    """Like the Update Engine's candidates: the live predictor sits in `predictor_`."""

    def __init__(self, predictor):
        self.predictor_ = predictor


def test_promoted_duration_model_is_used_and_fallback_otherwise(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    probe = Job(job_id="x", user="ann", vc="a", gpus=1, submit_time=0.0)
    fallback = default_policy(LucidConfig(), load_snapshot(store, time.time()))
    assert fallback.model_sources["duration"] == "history of 0 finished job(s)"
    assert fallback.duration_model.predict_duration([probe]) == [3600.0]
    history = [Job(job_id=f"h{i}", user="ann", vc="a", gpus=1, submit_time=0.0) for i in range(5)]
    trained = HistoryDurationPredictor().fit(history, [120.0] * 5)
    path = tmp_path / "models" / "duration.joblib"
    joblib.dump(Wrapped(trained), path)
    with store.session() as s:
        s.add(ModelVersionRow(kind="duration", version="v7", path=str(path), created_at=time.time(), active=True))
        s.add(ModelVersionRow(kind="packing:nvidia-h200:mps", version="broken",
                              path=str(tmp_path / "models" / "missing.joblib"), created_at=time.time(), active=True))
    policy = default_policy(LucidConfig(), load_snapshot(store, time.time()))
    assert policy.model_sources["duration"] == "promoted version v7"
    # an unreadable artifact is left out (that key shares nothing); it does not crash the round
    assert "nvidia-h200:mps" not in policy.model_sources["packing"]
    assert abs(policy.duration_model.predict_duration([probe])[0] - 120.0) < 1e-6
    store.dispose()


def test_a_promoted_model_learns_what_ended_after_it_and_a_lost_one_falls_back_to_the_history(tmp_path):
    """A round with a promoted duration model reads in full only the jobs that ended after the promotion
    (what the model must still learn); the history is read only when the fallback needs it, here because
    the promoted artifact is gone."""
    from lucid_core.runtime.store.schema import JobRow

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    promoted = time.time() - 1000
    with store.session() as s:
        for i, end in enumerate((promoted - 500, promoted - 100, promoted + 100, promoted + 200)):
            s.add(JobRow(job_id=f"h{i}", seq=i + 1, name="h", user="ann", vc="a", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=end - 400, start_time=end - 300, end_time=end))
        s.add(JobRow(job_id="x", seq=9, name="x", user="ann", vc="a", gpus=1, command="true", env={},
                     state="FAILED", submit_time=promoted, start_time=promoted + 1, end_time=promoted + 300))
        path = tmp_path / "models" / "duration.joblib"
        joblib.dump(HistoryDurationPredictor(), path)
        s.add(ModelVersionRow(kind="duration", version="v1", path=str(path), created_at=promoted, active=True))
    snapshot = load_snapshot(store, time.time())
    assert [row.job_id for row, _ in snapshot.unlearned] == ["h2", "h3"]
    assert [seconds for _, seconds in snapshot.unlearned] == [300.0, 300.0]
    assert snapshot.history is None  # the promoted model needs no history
    assert default_policy(LucidConfig(), snapshot).model_sources["duration"] == "promoted version v1"
    path.unlink()
    lost = load_snapshot(store, time.time())
    policy = default_policy(LucidConfig(), lost)
    assert policy.model_sources["duration"] == "history of 4 finished job(s)"
    assert [row.job_id for row, _ in lost.history] == ["h0", "h1", "h2", "h3"]  # read on demand, in end order
    probe = Job(job_id="p", user="ann", vc="a", gpus=1, submit_time=0.0)
    assert abs(policy.duration_model.predict_duration([probe])[0] - 300.0) < 1e-6
    store.dispose()


def test_a_finished_job_whose_stored_times_or_width_went_bad_is_left_out_of_the_history(tmp_path):
    """Whatever is written into a finished job's row is untrusted: text in its start time (SQLite stores
    it) or in its GPU count leaves that job out of what the models learn, and the round goes on."""
    from sqlalchemy import text

    from lucid_core.runtime.store.schema import JobRow

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    now = time.time()
    with store.session() as s:
        for i in range(5):
            s.add(JobRow(job_id=f"h{i}", seq=i + 1, name="h", user="ann", vc="a", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=now - 1000, start_time=now - 900, end_time=now - 800 + i))
    with store.session() as s:
        s.execute(text("UPDATE jobs SET start_time = 'x' WHERE job_id = 'h1'"))
        s.execute(text("UPDATE jobs SET end_time = 'later' WHERE job_id = 'h3'"))
    fallback = default_policy(LucidConfig(), load_snapshot(store, time.time()))
    assert fallback.model_sources["duration"] == "history of 3 finished job(s)"
    path = tmp_path / "models" / "duration.joblib"
    joblib.dump(HistoryDurationPredictor(), path)
    with store.session() as s:
        s.add(ModelVersionRow(kind="duration", version="v1", path=str(path), created_at=now - 2000, active=True))
    with store.session() as s:
        s.execute(text("UPDATE jobs SET gpus = 'many' WHERE job_id = 'h4'"))
    snapshot = load_snapshot(store, time.time())
    assert sorted(row.job_id for row, _ in snapshot.unlearned) == ["h0", "h2"]  # h4's width is text now
    assert default_policy(LucidConfig(), snapshot).model_sources["duration"] == "promoted version v1"
    path.unlink()  # and the fallback, reading the history on demand, leaves the same three out
    assert default_policy(LucidConfig(), load_snapshot(store, time.time())).model_sources["duration"] == (
        "history of 2 finished job(s)")
    store.dispose()


def test_explain_decomposes_a_ga2m_duration_into_term_contributions():
    import math

    from lucid_core.models.duration import DurationModel
    from lucid_core.models.synthetic import synthetic_job_log
    from lucid_core.runtime.round.prediction_words import duration_terms as _duration_terms

    log = synthetic_job_log(1500, n_users=10, days=5, seed=1)
    model = DurationModel(interactions=2, outer_bags=1, max_rounds=100, n_jobs=1).fit(log)
    row = log.iloc[-1]
    job = Job(job_id="x", user=row.user, vc=row.vc, gpus=int(row.gpus), submit_time=float(row.submit_time),
              name=row["name"])
    out = _duration_terms(model, job)
    total = out["intercept"] + sum(v for _, v in out["terms"])
    assert math.isclose(math.expm1(total), out["estimate_s"], rel_tol=1e-6)
    assert math.isclose(out["estimate_s"], model.predict_duration([job])[0], rel_tol=1e-6)
    assert {"gpus", "vc"} <= {name for name, _ in out["terms"]}


class RunsOnLoad:
    """An artifact whose loading runs code: it leaves a file behind."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_row_naming_an_artifact_outside_the_models_root_is_not_opened(tmp_path, capsys):
    """model_versions is written by whoever can write the store, and loading a joblib file runs its code: a
    round opens only files under LUCID_HOME/models (through links), falls back, and says why."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "ran"
    joblib.dump(RunsOnLoad(marker), elsewhere / "evil.joblib")
    (tmp_path / "models" / "link.joblib").symlink_to(elsewhere / "evil.joblib")
    rows = {"duration": str(elsewhere / "evil.joblib"),
            "throughput_forecaster": str(tmp_path / "models" / ".." / "elsewhere" / "evil.joblib"),
            "packing:nvidia-h200:mps": str(tmp_path / "models" / "link.joblib")}
    with store.session() as s:
        for kind, path in rows.items():
            s.add(ModelVersionRow(kind=kind, version="v1", path=path, created_at=time.time(), active=True))
    policy = default_policy(LucidConfig(), load_snapshot(store, time.time()))
    assert not marker.exists()
    assert policy.model_sources["duration"] == "history of 0 finished job(s)"
    assert policy.model_sources["throughput"] == "mean of recent slots"
    assert "nvidia-h200:mps" not in policy.model_sources["packing"]
    assert policy.model_sources["refused"].count("lies outside the models root") == 3
    # and `lucid explain` says so
    from lucid_core.cli import main
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    add_host(store, HostSpec("m0", executor="local", gpus=1, workdir=str(tmp_path / "m0")))
    job_id = submit(store, JobRequest(command="true", gpus=1, user="ann", vc="default"))
    capsys.readouterr()
    assert main(["explain", job_id, "--store", store.url]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("promoted model not used: ")]
    assert len(said) == 1 and said[0].count("lies outside the models root") == 3, said
    assert not marker.exists()
    # the same file under the root is loaded (and runs): the check, not the file, kept it out above
    joblib.dump(RunsOnLoad(marker), tmp_path / "models" / "inside.joblib")
    with store.session() as s:
        s.add(ModelVersionRow(kind="duration", version="v2", path=str(tmp_path / "models" / "inside.joblib"),
                              created_at=time.time() + 1, active=True))
    default_policy(LucidConfig(), load_snapshot(store, time.time() + 2))
    assert marker.exists()
    store.dispose()


def test_a_path_through_a_symlink_loop_is_refused_as_outside_the_root_not_raised(tmp_path):
    """pathlib raises RuntimeError (not ValueError) for a symlink loop: the Models page, which catches the
    check's ValueError, answered 500 for a store row naming such a path."""
    from lucid_core.models.registry import artifact_within

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ValueError, match="is not a path"):
        artifact_within(tmp_path / "a" / "model.joblib", tmp_path / "models")


def test_a_promoted_model_learns_the_jobs_that_ended_while_it_was_trained(tmp_path):
    """The Update Engine trains on the jobs that ended by its window's end; the model is promoted minutes later.
    The round learned live only what ended after the promotion, so a job that ended in between was learned by
    neither until the next run. Now the live set starts where the training data ends."""
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.update import extract_batch

    url = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(url)
    promoted = time.time() - 1000
    window_end = promoted - 300  # training took 5 minutes
    with store.session() as s:
        for i, end in enumerate((promoted - 500, promoted - 100, promoted + 100)):
            s.add(JobRow(job_id=f"h{i}", seq=i + 1, name="h", user="ann", vc="a", gpus=1, command="true", env={},
                         state="COMPLETED", submit_time=end - 400, start_time=end - 300, end_time=end))
        path = tmp_path / "models" / "duration.joblib"
        joblib.dump(HistoryDurationPredictor(), path)
        s.add(ModelVersionRow(kind="duration", version="v1", path=str(path), created_at=promoted, active=True,
                              metrics={"training_window": [window_end - 86400.0, window_end]}))
    assert [row.job_id for row, _ in load_snapshot(store, time.time()).unlearned] == ["h1", "h2"]
    # the training data is the other side of the same line: h0 only (h1 ended after the window's end)
    batch = extract_batch(url, tmp_path / "batch", "full", window_end, full_days=1)
    assert batch.job_rows == 1
    with store.session() as s:  # a window another writer broke counts from the promotion, as before
        s.query(ModelVersionRow).update({"metrics": {"training_window": ["x", None]}})
    assert [row.job_id for row, _ in load_snapshot(store, time.time()).unlearned] == ["h2"]
    store.dispose()
