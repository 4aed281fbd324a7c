"""The round consults the models the Update Engine promoted (model_versions), else refits fallbacks."""

from __future__ import annotations

import time

import joblib

from lucid_core.config import LucidConfig
from lucid_core.domain import Job
from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.runtime.round.live_models import default_policy
from lucid_core.runtime.round.snapshot import load_snapshot
from lucid_core.runtime.store.schema import ModelVersionRow
from lucid_core.runtime.store.store import Store


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
    path = tmp_path / "duration.joblib"
    joblib.dump(Wrapped(trained), path)
    with store.session() as s:
        s.add(ModelVersionRow(kind="duration", version="v7", path=str(path), created_at=time.time(), active=True))
        s.add(ModelVersionRow(kind="packing:nvidia-h200:mps", version="broken", path=str(tmp_path / "missing.joblib"),
                              created_at=time.time(), active=True))
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
        path = tmp_path / "duration.joblib"
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
    path = tmp_path / "duration.joblib"
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
