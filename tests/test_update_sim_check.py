"""Update Engine's simulator check of a duration candidate: the fallback stays when the candidate loses."""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa

from lucid_core.update import contended_nodes, promote_or_keep, simulated_duration_check


def test_contended_size_fills_the_target_load_and_fits_the_widest_job():
    gpus = np.array([8.0, 8.0, 32.0])
    durations = np.array([3600.0, 3600.0, 3600.0])
    submits = np.array([0.0, 1800.0, 3600.0])
    # 48 GPU-hours over one hour: 48 GPUs busy on average; at 90% of 8-GPU nodes -> 7 nodes
    assert contended_nodes(gpus, durations, submits, 8, 0.9) == 7
    assert contended_nodes(gpus, durations / 100, submits, 8, 0.9) == 4  # light load: the 32-GPU job sets it
    assert contended_nodes(gpus, durations, np.zeros(3), 8, 0.9) == 4  # one instant: widest job


def test_candidate_duration_model_is_simulated_against_the_fallback():
    from lucid_core.models.duration import DurationModel
    from lucid_core.models.synthetic import synthetic_job_log

    frame = synthetic_job_log(240, n_users=5, days=2, seed=3)
    frame = frame.assign(end_time=frame["submit_time"] + frame["duration"]).sort_values("end_time")
    frame = frame.reset_index(drop=True)
    recent = np.zeros(len(frame), dtype=bool)
    recent[-80:] = True
    model = DurationModel(interactions=0, outer_bags=1, max_rounds=10, n_jobs=1).fit(frame[~recent])
    check = simulated_duration_check(frame, recent, model)
    window = frame[recent]
    assert check["jobs"] == 80
    assert check["nodes"] == contended_nodes(window["gpus"].to_numpy(float),
                                             np.maximum(window["duration"].to_numpy(float), 1.0),
                                             window["submit_time"].to_numpy(float))
    assert check["fallback_avg_jct_s"] > 0 and check["candidate_avg_jct_s"] > 0
    assert check["candidate_wins"] == (check["candidate_avg_jct_s"] <= check["fallback_avg_jct_s"])


def test_a_candidate_that_loses_in_the_simulator_is_not_promoted(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    sa.create_engine(url).dispose()
    check = {"jobs": 200, "nodes": 6, "fallback_avg_jct_s": 7200.0, "candidate_avg_jct_s": 9000.0,
             "candidate_wins": False}
    evaluation = {"run_id": "r", "models": {"duration": {"candidate_mae": 0.5, "candidate_version": 1,
                                                         "sim_check": check}}}
    decision = promote_or_keep(url, evaluation)["decisions"]["duration"]
    assert decision["action"] == "keep"
    assert "loses in the simulator" in decision["why"] and "2.500 h vs history fallback 2.000 h" in decision["why"]
