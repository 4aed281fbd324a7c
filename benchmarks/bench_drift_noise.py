"""How often the Update Engine's input-shift alert fires by chance, and how often it finds a real shift, with
the fixed PSI threshold alone and with the sampling-noise floor (`alerts.psi_sampling_noise`), on Philly jobs.

Inputs are what the duration model's drift check watches (`update.duration_inputs`: GPUs, submit hour, GPU
use, absent in Philly so constant), kept as the Update Engine keeps them (`update.kept_sample`).

    .venv/bin/python benchmarks/bench_drift_noise.py [--trials 400] [--trace PATH] [--errors]

Three parts, each printed as a table with the two rules side by side:
- no shift: reference and recent jobs drawn at random from one month, recent windows of m jobs;
- a real shift drawn into the recent jobs (multi-GPU jobs 3x as likely; submissions only 09:00-18:00);
- the daily check as the Update Engine runs it, every day of Oct 10 - Nov 30, as the jobs were and with a
  real shift made in the recent jobs, under the fixed threshold, with the sampling noise, and with the
  training window's own spread (`update.input_spread`, what the check uses), at one check and at two in a row;
- with `--errors`, the error half too (the duration model refitted each day) and the alert as a whole.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from lucid_core.alerts import check_drift, population_stability_index, psi_sampling_noise
from lucid_core.models.datasets import load_philly_jobs
from lucid_core.update import DurationCandidate, _recent_mask, duration_inputs, input_spread, kept_sample

THRESHOLD = 0.2  # update.drift_psi's default
SIZES = (25, 50, 100, 200, 400, 1000)


def default_trace() -> Path:
    root = Path(os.environ.get("LUCID_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    return root / "philly" / "philly_jobs_2017-09_2017-11.csv"


def load_jobs(path: Path) -> pd.DataFrame:
    """Philly jobs as the Update Engine's job log (`datasets.load_philly_jobs`: times in seconds from the trace's
    first midnight, kept as `attrs["epoch"]`)."""
    jobs = load_philly_jobs(path)
    jobs = jobs.assign(time=jobs["submit_at"], end_time=jobs["submit_time"] + jobs["duration"], gpu_util=np.nan)
    jobs.attrs["epoch"] = jobs["submit_at"].min().normalize()
    return jobs


def kept_inputs(frame: pd.DataFrame) -> dict[str, list[float]]:
    return {name: kept_sample(values) for name, values in duration_inputs(frame).items()}


def alerts(reference: dict[str, list[float]], recent: dict[str, list[float]]) -> tuple[set[str], set[str]]:
    """The features each rule calls shifted: PSI above the threshold; and above the noise floor too."""
    fixed, floored = set(), set()
    for name in reference:
        psi = population_stability_index(reference[name], recent[name])
        if psi > THRESHOLD:
            fixed.add(name)
            if psi > psi_sampling_noise(reference[name], recent[name]):
                floored.add(name)
    return fixed, floored


def rates(reference: dict[str, list[float]], draw: Callable[[np.random.Generator, int], pd.DataFrame],
          sizes: tuple[int, ...], trials: int, seed: int) -> list[tuple[int, float, float, dict[str, float]]]:
    """Per recent-window size: the share of trials with any alert under each rule, and per feature (fixed)."""
    rng = np.random.default_rng(seed)
    out = []
    for m in sizes:
        fixed_any = floored_any = 0
        per_feature: dict[str, int] = {name: 0 for name in reference}
        for _ in range(trials):
            fixed, floored = alerts(reference, kept_inputs(draw(rng, m)))
            fixed_any += bool(fixed)
            floored_any += bool(floored)
            for name in fixed:
                per_feature[name] += 1
        out.append((m, fixed_any / trials, floored_any / trials, {k: v / trials for k, v in per_feature.items()}))
    return out


def print_rates(title: str, rows: list[tuple[int, float, float, dict[str, float]]]) -> None:
    print(f"\n### {title}\n")
    print("| recent jobs | alert, PSI > 0.2 | alert, PSI > max(0.2, noise floor) | fixed rule: gpus / submit_hour |")
    print("|---:|---:|---:|---|")
    for m, fixed, floored, per in rows:
        print(f"| {m} | {fixed:.1%} | {floored:.1%} | {per['gpus']:.1%} / {per['submit_hour']:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--trace", type=Path, default=default_trace())
    parser.add_argument("--errors", action="store_true",
                        help="also the error half: the duration model refitted for each day (about 8 minutes)")
    args = parser.parse_args()
    jobs = load_jobs(args.trace)
    month = jobs[(jobs["time"] >= "2017-10-01") & (jobs["time"] < "2017-11-01")].reset_index(drop=True)
    rng = np.random.default_rng(0)
    reference = kept_inputs(month.iloc[rng.choice(len(month), size=len(month) * 4 // 5, replace=False)])
    print(f"{len(jobs)} Philly jobs; reference: {len(month) * 4 // 5} jobs of Oct 2017 (kept as "
          f"{len(reference['gpus'])} quantiles per input), {args.trials} trials per size")

    same = rates(reference, lambda r, m: month.iloc[r.choice(len(month), size=m, replace=False)],
                 SIZES, args.trials, 1)
    print_rates("No shift: recent jobs drawn from the same month (every alert is a false one)", same)

    wide = month["gpus"].to_numpy() > 1
    weight = np.where(wide, 3.0, 1.0)
    weight /= weight.sum()
    more_wide = rates(reference, lambda r, m: month.iloc[r.choice(len(month), size=m, replace=False, p=weight)],
                      SIZES, args.trials, 2)
    print_rates(f"A real shift: multi-GPU jobs 3x as likely ({wide.mean():.0%} of jobs -> "
                f"{weight[wide].sum():.0%})", more_wide)
    hours = month["time"].dt.hour.to_numpy()
    day = np.flatnonzero((hours >= 9) & (hours < 18))
    daytime = rates(reference, lambda r, m: month.iloc[r.choice(day, size=m, replace=False)], SIZES, args.trials, 3)
    print_rates(f"A real shift: submissions only 09:00-18:00 ({len(day) / len(month):.0%} of the month's)", daytime)

    print_daily(jobs, args.errors)


def daily_split(jobs: pd.DataFrame, day: pd.Timestamp, recent_share: float = 0.2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What a daily Update Engine run on `day` trains on and checks: the jobs that finished in the finetune window
    (7 days) in order of their end, split into the older rows and the most recent `recent_share` (the DAG's
    default). Philly records no queueing, so a job ends its duration after its submission."""
    until = (day - jobs.attrs["epoch"]).total_seconds()
    batch = jobs[(jobs["end_time"] >= until - 7 * 86400.0) & (jobs["end_time"] < until)]
    batch = batch.sort_values("end_time", kind="stable").reset_index(drop=True)
    recent = _recent_mask(batch, recent_share)
    return batch[~recent].reset_index(drop=True), batch[recent].reset_index(drop=True)


def input_flags(jobs: pd.DataFrame, days: pd.DatetimeIndex,
                change: Callable[[pd.DataFrame], pd.DataFrame]) -> list[dict[str, bool]]:
    """Per day, whether each rule calls an input shifted: the model promoted the day before is checked on the
    day's recent rows (after `change`), as `update.drift_reports` does."""
    flags = []
    for day in days:
        older, _ = daily_split(jobs, day - pd.Timedelta(days=1))
        _, recent = daily_split(jobs, day)
        recent = change(recent)
        reference = kept_inputs(older)
        spread = input_spread(duration_inputs(older), len(recent))
        fixed, floored = alerts(reference, kept_inputs(recent))
        report = check_drift("duration", [1.0], [1.0], reference, kept_inputs(recent), 1.25, THRESHOLD, spread)
        flags.append({"fixed": bool(fixed), "noise": bool(floored), "spread": bool(report.shifted_features)})
    return flags


def error_ratio_noise(reference: list[float], size: int, draws: int = 2000) -> float:
    """The error ratio that `size` errors drawn from the reference errors themselves pass in 1% of draws."""
    errors = np.asarray(reference, dtype=float)
    rng = np.random.default_rng([errors.size, size])
    means = errors[rng.integers(0, errors.size, size=(draws, size))].mean(axis=1)
    return float(np.quantile(means / errors.mean(), 0.99))


def error_flags(jobs: pd.DataFrame, days: pd.DatetimeIndex, noise: list[float] | None = None) -> list[bool]:
    """Per day, whether the duration model promoted the day before errs more than 1.25x its error at promotion
    on the day's recent jobs (`update.DurationCandidate`, fitted each day as a daily run fits it); `noise` gets
    each day's `error_ratio_noise`."""
    flags, promoted = [], None
    for day in [days[0] - pd.Timedelta(days=1), *days]:
        older, recent = daily_split(jobs, day)
        batch = pd.concat([older, recent], ignore_index=True)
        held = np.arange(len(batch)) >= len(older)
        if promoted is not None:
            model, reference = promoted
            recent = kept_sample(model.errors(batch, held))
            report = check_drift("duration", reference, recent, {}, {}, 1.25, THRESHOLD)
            flags.append(report.error_drift)
            if noise is not None:
                noise.append(error_ratio_noise(reference, len(recent)))
        candidate = DurationCandidate().fit(older)
        promoted = (candidate, kept_sample(candidate.errors(batch, held)))
    return flags


def in_a_row(flags: list[bool], checks: int) -> int:
    """Days that alert when the alert waits for `checks` drifted checks in a row."""
    return sum(all(flags[i - k] for k in range(checks)) for i in range(checks - 1, len(flags)))


def print_daily(jobs: pd.DataFrame, with_errors: bool) -> None:
    days = pd.date_range("2017-10-10", "2017-11-30", freq="D")
    wide = lambda frame: frame.assign(gpus=np.where(np.arange(len(frame)) % 4 == 0,  # noqa: E731
                                                    8.0, frame["gpus"].to_numpy()))
    later = lambda frame: frame.assign(submit_time=frame["submit_time"] + 8 * 3600.0)  # noqa: E731
    print("\n### The daily check as the Update Engine runs it (the jobs that ended in 7 days, the last 20% of them "
          f"checked against the model promoted the day before), {len(days)} days of Oct 10 - Nov 30\n")
    print("| recent jobs | days alerted: PSI > 0.2 | + sampling noise | + the training window's own spread "
          "| the same, 2 checks in a row |")
    print("|---|---:|---:|---:|---:|")
    unchanged: list[bool] = []
    for label, change in (("as they were (no shift was made)", lambda frame: frame),
                          ("every 4th job made an 8-GPU job (a real shift)", wide),
                          ("every submission 8 hours later (a real shift)", later)):
        flags = input_flags(jobs, days, change)
        spread = [f["spread"] for f in flags]
        unchanged = unchanged or spread
        print(f"| {label} | {sum(f['fixed'] for f in flags)} | {sum(f['noise'] for f in flags)} | {sum(spread)} "
              f"| {in_a_row(spread, 2)} |")
    if not with_errors:
        return
    noise: list[float] = []
    errors = error_flags(jobs, days, noise)
    either = [a or b for a, b in zip(unchanged, errors, strict=True)]
    print(f"\n### The whole alert, nothing changed ({len(days)} days; error: the duration EBM refitted daily)\n")
    print("| half | days drifted | alerts at 2 checks in a row |")
    print("|---|---:|---:|")
    for label, flags in (("inputs (with the spread)", unchanged), ("error ratio > 1.25", errors),
                         ("either: the alert", either)):
        print(f"| {label} | {sum(flags)} | {in_a_row(flags, 2)} |")
    print("\nerror ratio over 1.25 by day: " + "".join("X" if e else "." for e in errors))
    print(f"the error ratio chance passes in 1% of draws at these sizes: {min(noise):.2f}-{max(noise):.2f}")


if __name__ == "__main__":
    main()
