"""The input-shift half of the drift check: discrete inputs keep their values apart, and a PSI counts as a shift
only above what sampling and the training window's own windows reach, so that bursts of submissions do not
alert every day while a real change still does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lucid_core.alerts import check_drift, population_stability_index, psi_sampling_noise, window_spread
from lucid_core.update import input_spread, kept_sample, reference_spread

THRESHOLD = 0.2


def test_a_shift_in_the_rare_values_of_a_discrete_input_shows():
    """95% of jobs on one GPU made every decile 1: quantile bins put all jobs in one bin, so no change in the
    wider jobs could show. Each value now has its bin, and one the reference never held has its own."""
    reference = [1.0] * 950 + [8.0] * 50
    assert population_stability_index(reference, [1.0] * 95 + [8.0] * 5) == pytest.approx(0.0, abs=1e-9)
    wider = [1.0] * 60 + [8.0] * 40
    assert population_stability_index(reference, wider) > 0.5
    assert population_stability_index(reference, [1.0] * 90 + [16.0] * 10) > 0.5  # a value never seen
    report = check_drift("duration", [1.0], [1.0], {"gpus": reference}, {"gpus": wider}, 1.25, THRESHOLD)
    assert report.shifted_features == ["gpus"]


def test_small_recent_windows_of_an_unchanged_input_rarely_alert():
    """Two samples of one distribution: at 40 recent values PSI passes 0.2 often by chance; above the sampling
    noise it rarely does. A real shift of the same size of window is still found."""
    rng = np.random.default_rng(7)
    reference = rng.normal(0.0, 1.0, 512)
    by_threshold = by_floor = found = 0
    trials = 300
    for _ in range(trials):
        same = rng.normal(0.0, 1.0, 40)
        psi = population_stability_index(reference, same)
        by_threshold += psi > THRESHOLD
        by_floor += psi > max(THRESHOLD, psi_sampling_noise(reference, same))
        moved = rng.normal(1.5, 1.0, 40)
        found += population_stability_index(reference, moved) > max(THRESHOLD, psi_sampling_noise(reference, moved))
    assert by_threshold / trials > 0.15
    assert by_floor / trials <= 0.03
    assert found / trials >= 0.95


def bursty_hours(days: int, rng: np.random.Generator, per_day: int = 120) -> np.ndarray:
    """Submit hours in time order, as bursts: each day's jobs fall in three hours picked at random."""
    out = []
    for _ in range(days):
        hours = rng.choice(24, size=3, replace=False)
        out.append(np.sort(rng.choice(hours, size=per_day) + rng.random(per_day)))
    return np.concatenate(out)


def test_a_window_like_the_training_windows_does_not_alert_and_one_unlike_them_does():
    rng = np.random.default_rng(3)
    training = bursty_hours(20, rng)
    reference = kept_sample(training)
    spread = window_spread(reference, training, 120, keep=kept_sample)
    assert spread > 1.0  # one day of bursts differs from the month by far more than the threshold
    another_day = kept_sample(bursty_hours(1, rng))
    alone = check_drift("duration", [1.0], [1.0], {"submit_hour": reference}, {"submit_hour": another_day},
                        1.25, THRESHOLD)
    judged = check_drift("duration", [1.0], [1.0], {"submit_hour": reference}, {"submit_hour": another_day},
                         1.25, THRESHOLD, {"submit_hour": spread})
    assert alone.shifted_features == ["submit_hour"] and judged.shifted_features == []
    assert "windows of this size within the training window reached" in judged.body
    one_hour = kept_sample(np.full(120, 4.5) + rng.random(120) * 0.1)  # every job in one tenth of an hour
    assert check_drift("duration", [1.0], [1.0], {"submit_hour": reference}, {"submit_hour": one_hour},
                       1.25, THRESHOLD, {"submit_hour": spread}).shifted_features == ["submit_hour"]


def test_the_spread_needs_two_windows_and_is_kept_per_input():
    values = np.arange(100, dtype=float)
    assert window_spread(kept_sample(values), values, 60) == 0.0  # fewer than two windows: nothing learned
    spread = input_spread({"gpus": np.ones(400), "submit_hour": np.linspace(0, 24, 400)}, 50)
    assert spread["gpus"] == 0.0 and spread["submit_hour"] > 1.0  # time-ordered hours: each window is its own


@pytest.mark.parametrize("stored", [None, "0.5", [0.5], {"gpus": "0.5"}, {"gpus": math.nan}, {"gpus": -1.0},
                                    {"gpus": math.inf}, {"gpus": True}])
def test_a_stored_spread_gone_bad_is_left_out(stored):
    """The spread is JSON in the store's model_versions row: another writer can put anything there. What is
    not a finite PSI >= 0 is left out, and the check falls back to the threshold and the sampling noise."""
    assert reference_spread(stored) == {}
    assert reference_spread({"gpus": 0.3, "submit_hour": 2}) == {"gpus": 0.3, "submit_hour": 2.0}
