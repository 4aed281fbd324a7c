"""Benchmarks of the interpretable models against the paper's figures and black-box baselines.

    .venv/bin/python benchmarks/bench_models.py [--sections packing,throughput,duration,names,jct]
                                               [--figures benchmarks/results/models]

Prints markdown tables (the source of benchmarks/results/models.md). Reads the reference data from
$LUCID_SHARED_DATA (default ../shared/data).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from lucid_core.domain import Job
from lucid_core.models.datasets import load_philly_jobs, load_throughput_series, shared_data_dir

warnings.filterwarnings("ignore", category=UserWarning)
DATA = shared_data_dir()
PHILLY = DATA / "philly" / "philly_jobs_2017-09_2017-11.csv"
VENUS = DATA / "venus" / "cluster_throughput_2020-04_2020-08.csv"
CATALOG = DATA / "lucid_artifact"
TEST_START, TEST_END = "2017-10-01", "2017-10-08"


def bench_packing(figures: Path | None) -> None:
    from lucid_core.models.packing import FEATURES, PackingTree, load_packing_catalog, pair_quality

    catalog = load_packing_catalog(CATALOG)
    X = catalog.profiles[list(FEATURES)]
    print("## Packing Analyze Model\n")
    print(f"{len(X)} measured configurations, {len(catalog.pairs)} measured pairs; binder rule: score sum <= 2 "
          "and summed exclusive footprints <= 24576 MB; a good pair keeps both speeds >= 0.85.\n")
    print("| labels | ccp_alpha | train accuracy | CV accuracy (paper 94.1%) | nested CV | leaves | "
          "UG | UM | MG | AMP | fit s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    trees = {}
    for source in ("speeds", "catalog"):
        started = time.perf_counter()
        tree = PackingTree(label_source=source).fit_catalog(catalog)
        seconds = time.perf_counter() - started
        y = tree.catalog_labels(catalog)
        imp = tree.feature_importances_
        leaves = sum(1 for n in tree.nodes_ if n["left"] < 0)
        in_sample = float((tree.predict(X) == y).mean())
        print(f"| {source} | {tree.ccp_alpha_:.4f} | {in_sample:.3f} | {tree.cv_accuracy_:.3f} | "
              f"{tree.nested_cv_accuracy(X, y):.3f} | "
              f"{leaves} | {imp['gpu_util']:.2f} | {imp['mem_util']:.2f} | {imp['gpu_mem_mb']:.2f} | "
              f"{imp['amp']:.2f} | {seconds:.2f} |")
        trees[source] = (tree, y)
    print("\n| labels | classes from | allowed pairs | precision (paper 98.1%) | coverage (paper 87.0%) |")
    print("|---|---|---|---|---|")
    for source, (tree, y) in trees.items():
        oof = tree.out_of_fold_labels(X, y)
        for label, classes in (("tree, in-sample", tree.predict(X)), ("tree, out-of-fold", oof),
                               ("measured labels", y)):
            q = pair_quality(catalog, classes)
            print(f"| {source} | {label} | {q.allowed} | {q.precision:.1%} | {q.coverage:.1%} |")
    print(f"\nTree (labels from speeds):\n\n```\n{trees['speeds'][0].export_text()}\n```\n")
    if figures:
        trees["speeds"][0].plot(figures / "packing_tree.png")


def bench_throughput(figures: Path | None) -> None:
    from lucid_core.models.contributions import plot_shape_functions
    from lucid_core.models.throughput import ThroughputForecast, ThroughputModel, evaluate_throughput

    series = load_throughput_series(VENUS)
    print("## Throughput Predict Model (Venus, train 2020-04..07, validate 2020-08)\n")
    print("| target | slots | EBM MAE | naive last slot | HGB squared | HGB log target | HGB absolute | EBM fit s |")
    print("|---|---|---|---|---|---|---|---|")
    models = {}
    for target in ("submit_gpu_job", "submit_gpu_num"):
        model = ThroughputModel(target)
        s = evaluate_throughput(series, target, "2020-08-01", model)
        b = s.baselines
        print(f"| {target} | {s.slots} | **{s.model_mae:.3f}** | {s.naive_mae:.3f} | {b['hgb_squared']:.3f} | "
              f"{b['hgb_log_target']:.3f} | {b['hgb_absolute']:.3f} | {model.fit_seconds_:.1f} |")
        models[target] = model
        if figures:
            plot_shape_functions(model.ebm_, figures / "throughput", prefix=target)
    jobs = models["submit_gpu_job"]
    top = sorted(zip(jobs.ebm_.term_importances(), jobs.ebm_.term_names_, strict=True), reverse=True)[:6]
    print("\nMost important terms (submit_gpu_job): " + ", ".join(f"{n} {v:.3f}" for v, n in top))
    epoch = pd.Timestamp("2020-08-01")
    forecaster = ThroughputForecast(jobs, models["submit_gpu_num"], epoch=epoch)
    week = series.loc["2020-08-01":"2020-08-08"]
    for ts, row in week.iterrows():
        t = (ts - epoch).total_seconds()
        n = int(row["submit_gpu_job"])
        for k in range(n):  # spread the slot's submissions inside it; its GPUs go with the first
            forecaster.observe_submission(t + k * 600.0 / (n + 1), int(row["submit_gpu_num"]) if k == 0 else 0)
    started = time.perf_counter()
    now = (week.index[-1] - epoch).total_seconds() + 600
    for i in range(20):
        forecaster.forecast(now + i * 600)
    per_call_ms = (time.perf_counter() - started) / 20 * 1e3
    print(f"\nOnline forecast (both EBMs, a week of slots observed): {per_call_ms:.1f} ms per call; "
          "the policy asks once per mode-check interval (600 s).\n")


class OracleDurations:
    """True durations from the trace: the upper bound a perfect Workload Estimate Model would reach."""

    def __init__(self, durations: dict[str, float]) -> None:
        self.durations = durations

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        return [self.durations[j.job_id] for j in jobs]

    def observe(self, job: Job, duration: float) -> None:
        return None


def _philly_split():
    frame = load_philly_jobs(PHILLY)
    test = ((frame["submit_at"] >= TEST_START) & (frame["submit_at"] < TEST_END)).to_numpy()
    return frame, test


def bench_duration(figures: Path | None) -> None:
    from lucid_core.models.contributions import plot_shape_functions
    from lucid_core.models.duration import DurationModel, hgb_baseline, score_log

    frame, test = _philly_split()
    y = np.log1p(frame["duration"].to_numpy())
    print(f"## Workload Estimate Model (Philly; test: {int(test.sum())} jobs submitted {TEST_START}..2017-10-07, "
          f"train: the other {int((~test).sum())})\n")
    print("VC stands in for the user; no names in this trace. History features use only jobs that ended "
          "(submit + duration) before the job's submission.\n")
    rows = []
    for label, params in (("EBM", {}), ("EBM + monotone GPU demand", {"monotone_gpus": True})):
        model = DurationModel(**params)
        started = time.perf_counter()
        X = model.prepare(frame, name_source=frame[~test])
        prep = time.perf_counter() - started
        model.fit_design(X[~test], y[~test])
        timing = f"{model.fit_seconds_:.1f} (+{prep:.1f} replay)"
        rows.append((label, score_log(y[test], model.predict_log(X[test])), timing))
        if label == "EBM":
            plain, X_plain = model, X
    started = time.perf_counter()
    hgb = hgb_baseline(X[~test], y[~test], X[test])
    timing = f"{time.perf_counter() - started:.1f}"
    rows.append(("HistGradientBoosting (same features)", score_log(y[test], hgb), timing))
    rows.append(("history fallback alone", score_log(y[test], X.loc[test, "history_estimate"].to_numpy()), "-"))
    print("| model | R² | Spearman | MAE (log s) | fit s |\n|---|---|---|---|---|")
    for label, s, seconds in rows:
        print(f"| {label} | {s.r2:.3f} | {s.spearman:.3f} | {s.mae_log:.3f} | {seconds} |")
    print(f"\nMonotone constraint: R² change {rows[1][1].r2 - rows[0][1].r2:+.3f} (paper, Venus: +2.6%).")
    longer = test & (frame["duration"].to_numpy() > 200)
    cond = DurationModel(condition_on_s=200.0)
    X_cond = cond.prepare(frame, name_source=frame[~test])
    cond.fit_design(X_cond[~test], y[~test])
    train_longer = ~test & (frame["duration"].to_numpy() > 200)
    hgb_cond = hgb_baseline(X_cond[train_longer], y[train_longer], X_cond[longer])
    print(f"\nAs Lucid uses it: jobs that outlived a 200 s profiling window ({int(longer.sum())} test jobs), "
          "models conditioned on that (trained on >200 s jobs; history estimate over >200 s history jobs):\n")
    print("| model (jobs > 200 s) | R² | Spearman | MAE (log s) |\n|---|---|---|---|")
    for label, pred in (("EBM conditioned on > 200 s", cond.predict_log(X_cond[longer])),
                        ("HistGradientBoosting, same rows and features", hgb_cond),
                        ("history fallback conditioned on > 200 s", X_cond.loc[longer, "history_estimate"].to_numpy()),
                        ("unconditioned EBM", plain.predict_log(X_plain[longer]))):
        s = score_log(y[longer], pred)
        print(f"| {label} | {s.r2:.3f} | {s.spearman:.3f} | {s.mae_log:.3f} |")
    explanation = plain.explain(X_plain[test].iloc[[0]])[0]
    print(f"\nOne explanation (log1p seconds): `{explanation.as_text(6)}`; sum check "
          f"{abs(explanation.total() - plain.ebm_.predict(X_plain[test].iloc[[0]][plain.feature_names_])[0]):.1e}.")
    jobs = [Job(job_id=f"q{i}", user=r.user, vc=r.vc, gpus=int(r.gpus), submit_time=float(r.submit_time))
            for i, r in enumerate(frame[test].head(2048).itertuples())]
    plain.predict_duration(jobs[:10])
    started = time.perf_counter()
    plain.predict_duration(jobs)
    batch = time.perf_counter() - started
    started = time.perf_counter()
    for job in jobs[:200]:
        plain.predict_duration([job])
    single = (time.perf_counter() - started) / 200
    print(f"\nInference: {batch * 1e3:.1f} ms for a batch of 2,048 jobs (features from history + EBM); "
          f"{single * 1e3:.2f} ms for one job alone.\n")
    if figures:
        plot_shape_functions(plain.ebm_, figures / "duration", prefix="duration")


def bench_names() -> None:
    from lucid_core.models.names import JobNameBucketer

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz_"))
    names = sorted({"".join(rng.choice(letters, size=int(rng.integers(8, 30)))) for _ in range(10_200)})[:10_000]
    started = time.perf_counter()
    bucketer = JobNameBucketer().fit(names)
    ids = bucketer.transform(names)
    print(f"## Job-name buckets\n\n10,000 distinct random names -> {len(set(ids))} buckets in "
          f"{time.perf_counter() - started:.2f} s (affinity propagation on an {bucketer.max_sample}-name sample, "
          "the rest joined to the nearest exemplar by normalized Levenshtein distance).\n")


def _config(aging: float | None):
    from lucid_core.config import load_config

    config = load_config(None)
    return config if aging is None else config.with_overrides({"orchestrator.aging": aging})


def bench_jct(nodes_list: Sequence[int], aging: float | None = None) -> None:
    from lucid_core.models.duration import DurationModel
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    frame, test = _philly_split()
    catalog = WorkloadCatalog.from_artifact(CATALOG)
    start = pd.Timestamp(TEST_START)

    def trained(rows: np.ndarray, condition: float = 0.0) -> DurationModel:
        model = DurationModel(condition_on_s=condition)
        X = model.prepare(frame, name_source=frame[rows])
        model.fit_design(X[rows], np.log1p(frame["duration"].to_numpy())[rows])
        return model

    before = (frame["submit_at"] < start).to_numpy()
    started = time.perf_counter()
    variants = {"EBM (trained on all but the test week)": trained(~test),
                "EBM (trained on jobs before Oct 1 only)": trained(before),
                "EBM on >200 s jobs (all but the test week)": trained(~test, 200.0)}
    fit_s = time.perf_counter() - started
    print(f"## Effect on Lucid's JCT (Philly {TEST_START}..2017-10-07, simulator, "
          f"orchestrator.aging={_config(aging).orchestrator.aging:g})\n")
    print(f"Each EBM's online history restarts from the jobs submitted before {TEST_START} (those still running join "
          f"it when their trace end passes) and grows with the jobs that end during the simulation (`observe`). "
          f"Fitting the three EBMs took {fit_s:.0f} s.\n")
    print("| nodes | duration model in Lucid | avg JCT h | avg queue h | P99.9 queue h | sim s |")
    print("|---|---|---|---|---|---|")
    for nodes in nodes_list:
        exp, _ = load_experiment(PHILLY, "philly", TEST_START, TEST_END, nodes=nodes, catalog=catalog,
                                 config=_config(aging))
        history = pd.DataFrame({
            "job_id": [r.job_id for r in exp.history], "submit_time": [r.submit_time for r in exp.history],
            "duration": [r.duration for r in exp.history], "gpus": [r.gpus for r in exp.history],
            "vc": [r.vc for r in exp.history], "user": [r.user or r.vc for r in exp.history], "name": "",
        })
        truth = {r.job_id: r.duration for r in exp.records}
        runs: list[tuple[str, str, object]] = [
            ("fifo", "(FIFO, no model)", None), ("sjf", "(SJF, true durations)", None),
            ("lucid", "history fallback", None)]
        for label, model in variants.items():
            model.epoch_ = start
            model.warm_history(history, until=0.0)
            runs.append(("lucid", label, model))
        runs.append(("lucid", "true durations (oracle)", OracleDurations(truth)))
        for policy, label, model in runs:
            _, m = run_policy(policy, exp, duration_model=model)
            print(f"| {nodes} | {label} | {m['avg_jct_h']:.3f} | {m['avg_queue_h']:.3f} | {m['p999_queue_h']:.2f} | "
                  f"{m['wall_s']:.1f} |")
    print()


def bench_jct_synthetic(nodes_list: Sequence[int]) -> None:
    """The same comparison on a synthetic log that has what Philly lacks: users and recurring job names."""
    import tempfile

    from lucid_core.config import load_config
    from lucid_core.models.duration import DurationModel, score_log
    from lucid_core.models.synthetic import synthetic_job_log
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    log = synthetic_job_log(15000, n_users=40, days=21, seed=11)
    start = pd.Timestamp("2024-01-15")
    before = (log["submit_at"] < start).to_numpy()
    y = np.log1p(log["duration"].to_numpy())
    variants = {}
    print("## Effect on Lucid's JCT on a synthetic log with users and job names\n")
    print(f"`synthetic_job_log(15000, n_users=40, days=21, seed=11)`: {len(log)} jobs, "
          f"{log['name'].nunique()} distinct names, {log['user'].nunique()} users; models trained on the "
          f"{int(before.sum())} jobs submitted before {start.date()}, Lucid simulated on the last 7 days.\n")
    print("| model (held-out week, jobs > 200 s) | R² | Spearman | MAE (log s) |\n|---|---|---|---|")
    longer = ~before & (log["duration"].to_numpy() > 200)
    for label, frame in (("EBM with name buckets", log), ("EBM without names", log.assign(name=""))):
        model = DurationModel(condition_on_s=200.0)
        X = model.prepare(frame, name_source=frame[before])
        model.fit_design(X[before], y[before])
        variants[label] = (model, frame)
        s = score_log(y[longer], model.predict_log(X[longer]))
        print(f"| {label} | {s.r2:.3f} | {s.spearman:.3f} | {s.mae_log:.3f} |")
    s = score_log(y[longer], X.loc[longer, "history_estimate"].to_numpy())
    print(f"| history fallback (conditioned) | {s.r2:.3f} | {s.spearman:.3f} | {s.mae_log:.3f} |\n")
    catalog = WorkloadCatalog.from_artifact(CATALOG)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "synthetic.csv"
        out = log[["job_id", "submit_at", "duration", "gpus", "vc", "user", "name"]].rename(
            columns={"submit_at": "submit_time"})
        out.assign(submit_time=out["submit_time"].dt.strftime("%Y-%m-%d %H:%M:%S")).to_csv(trace, index=False)
        print("| nodes | duration model in Lucid | avg JCT h | avg queue h | P99.9 queue h | sim s |")
        print("|---|---|---|---|---|---|")
        for nodes in nodes_list:
            exp, _ = load_experiment(trace, "generic", str(start.date()), None, nodes=nodes, catalog=catalog,
                                     config=load_config(None))
            truth = {r.job_id: r.duration for r in exp.records}
            runs: list[tuple[str, str, object]] = [("fifo", "(FIFO, no model)", None),
                                                   ("lucid", "history fallback", None)]
            for label, (model, frame) in variants.items():
                model.epoch_ = start
                history = frame[before].assign(submit_time=(frame["submit_at"][before] - start).dt.total_seconds())
                model.warm_history(history, until=0.0)
                runs.append(("lucid", label, model))
            runs.append(("lucid", "true durations (oracle)", OracleDurations(truth)))
            for policy, label, model in runs:
                _, m = run_policy(policy, exp, duration_model=model)
                print(f"| {nodes} | {label} | {m['avg_jct_h']:.3f} | {m['avg_queue_h']:.3f} | "
                      f"{m['p999_queue_h']:.2f} | {m['wall_s']:.1f} |")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="packing,throughput,duration,names,jct,jct-synthetic")
    parser.add_argument("--figures", help="write PNGs (tree, shape functions) under this directory")
    parser.add_argument("--nodes", default="72,54,40")
    parser.add_argument("--synthetic-nodes", default="48,40")
    parser.add_argument("--aging", type=float, help="override orchestrator.aging for the Philly JCT section")
    args = parser.parse_args()
    figures = Path(args.figures) if args.figures else None
    if figures:
        figures.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    if "packing" in sections:
        bench_packing(figures)
    if "throughput" in sections:
        bench_throughput(figures)
    if "duration" in sections:
        bench_duration(figures)
    if "names" in sections:
        bench_names()
    if "jct" in sections:
        bench_jct([int(n) for n in args.nodes.split(",")], args.aging)
    if "jct-synthetic" in sections:
        bench_jct_synthetic([int(n) for n in args.synthetic_nodes.split(",")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
