"""`lucid models ...`: train, evaluate, register and compare the three interpretable models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lucid_core.models.datasets import REPO_ROOT, shared_data_dir

DEFAULT_REGISTRY = "out/models/registry"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `lucid models` and its subcommands on the top-level parser."""
    models = subparsers.add_parser("models", help="train, evaluate and version the interpretable models")
    sub = models.add_subparsers(dest="models_command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("train-packing", help="fit the packing tree on a measured co-location catalog")
    p.add_argument("--catalog", default=str(shared_data_dir() / "lucid_artifact"),
                   help="dir with single_data.csv + colocate_info.csv")
    p.add_argument("--label-source", choices=("speeds", "catalog"), default="speeds",
                   help="labels from measured co-located speeds (default) or the catalog's label column")
    p.add_argument("--tiny", type=float, default=0.95, help="mean co-located speed at or above: Tiny")
    p.add_argument("--medium", type=float, default=0.85, help="mean co-located speed at or above: Medium")
    p.add_argument("--gpu-model", default=None,
                   help="GPU model the catalog was measured on (default: its environment.json)")
    p.add_argument("--sharing", choices=("time-slice", "mps"), default=None,
                   help="how the pairs shared the GPU (default: its environment.json)")
    p.add_argument("--store", default=None,
                   help="with --promote: the store whose hosts of this GPU model and mechanism use the tree "
                        "(default: LUCID_STORE_URL, else LUCID_HOME's)")
    p.add_argument("--out", help="write the tree as readable JSON here")
    p.add_argument("--png", help="draw the tree to this PNG")
    _registry_args(p)
    p.set_defaults(func=_train_packing)

    p = sub.add_parser("train-throughput", help="fit the throughput EBMs on a 10-minute submission series")
    p.add_argument("--series", default=str(shared_data_dir() / "venus" / "cluster_throughput_2020-04_2020-08.csv"))
    p.add_argument("--target", choices=("submit_gpu_job", "submit_gpu_num", "both"), default="both")
    p.add_argument("--validate-from", default=None,
                   help="hold out slots from this time on (default: the last calendar month of the series)")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--bags", type=int, default=4)
    p.add_argument("--interactions", type=int, default=5)
    p.add_argument("--shapes", help="write one shape-function PNG per term here")
    _registry_args(p)
    p.set_defaults(func=_train_throughput)

    p = sub.add_parser("train-duration", help="fit the duration EBM on a job log (Philly format or generic CSV)")
    p.add_argument("--trace", default=str(shared_data_dir() / "philly" / "philly_jobs_2017-09_2017-11.csv"))
    p.add_argument("--test-start", default="2017-10-01", help="held-out submissions from (inclusive)")
    p.add_argument("--test-end", default="2017-10-08", help="held-out submissions until (exclusive)")
    p.add_argument("--max-train-rows", type=int, default=None, help="subsample the training rows")
    p.add_argument("--monotone-gpus", action="store_true", help="isotonic shape in GPU demand")
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--bags", type=int, default=2)
    p.add_argument("--shapes", help="write one shape-function PNG per term here")
    _registry_args(p)
    p.set_defaults(func=_train_duration)

    p = sub.add_parser("eval", help="score a registered model on data (default: its promoted version)")
    p.add_argument("kind", choices=("packing", "throughput", "duration"))
    p.add_argument("--name", help="registry name (default: the kind, or submit_gpu_job for throughput)")
    p.add_argument("--version", type=int)
    p.add_argument("--data", help="catalog dir / series file / trace file (defaults as for training)")
    p.add_argument("--from", dest="start", help="score slots or submissions from this time")
    p.add_argument("--until", dest="end", help="... until this time (exclusive)")
    p.add_argument("--registry", default=DEFAULT_REGISTRY)
    p.set_defaults(func=_eval)

    p = sub.add_parser("list", help="list registered model versions")
    p.add_argument("--name")
    p.add_argument("--registry", default=DEFAULT_REGISTRY)
    p.set_defaults(func=_list)

    p = sub.add_parser("compare", help="metrics of two versions side by side")
    p.add_argument("name")
    p.add_argument("a", type=int)
    p.add_argument("b", type=int)
    p.add_argument("--registry", default=DEFAULT_REGISTRY)
    p.set_defaults(func=_compare)

    p = sub.add_parser("promote", help="make a version the one `load` returns")
    p.add_argument("name")
    p.add_argument("version", type=int)
    p.add_argument("--registry", default=DEFAULT_REGISTRY)
    p.set_defaults(func=_promote)
    return models


def _registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", default=None, help=f"model registry directory (default: {DEFAULT_REGISTRY}; "
                   "train-packing --promote: LUCID_HOME/models/registry, the only place a round loads a tree from)")
    p.add_argument("--no-register", action="store_true", help="only print the evaluation")
    p.add_argument("--promote", action="store_true", help="promote the new version")


def _promotion_registry(args: argparse.Namespace) -> str | None:
    """Settle train-packing's registry before training: with --promote, the tree goes to the store, and a round
    loads only artifacts under LUCID_HOME/models, so the registry defaults to (and must lie) there. Returns why
    not, or None."""
    from lucid_core.models.registry import artifact_within, models_root

    if not args.promote or args.no_register:
        return None
    args.registry = args.registry or str(models_root() / "registry")
    try:
        artifact_within(args.registry, models_root())
    except ValueError:
        return (f"--promote puts the tree in the store, and a round loads only artifacts under LUCID_HOME/models "
                f"({models_root()}); --registry {args.registry} lies outside it (leave --registry out, or set "
                "LUCID_HOME)")
    return None


def _register(args: argparse.Namespace, name: str, model: object, **meta: object) -> None:
    if args.no_register:
        return
    from lucid_core.models.registry import ModelRegistry

    args.registry = args.registry or DEFAULT_REGISTRY
    registry = ModelRegistry(args.registry)
    version = registry.register(name, model, **meta)
    if args.promote:
        registry.promote(name, version.version)
    print(f"registered {name} v{version.version} in {args.registry}{' (promoted)' if args.promote else ''}")
    if args.promote and name.startswith("packing:"):  # the live round reads packing models from the store
        from lucid_core.runtime.store.store import open_store, record_promotion

        store = open_store(getattr(args, "store", None))
        try:
            with store.session() as session:
                record_promotion(session, name, str(version.version),
                                 str(registry.artifact_path(name, version.version)), dict(version.metrics),
                                 "promoted by lucid models train-packing")
        finally:
            store.dispose()
        print(f"hosts with {name.split(':', 1)[1]} in {store.url} now pair by this tree")


def _train_packing(args: argparse.Namespace) -> int:
    from lucid_core.models.datasets import file_sha256
    from lucid_core.models.packing import FEATURES, PackingTree, catalog_key, load_packing_catalog, pair_quality

    try:
        key = catalog_key(args.catalog, args.gpu_model, args.sharing)
    except ValueError as exc:
        print(f"lucid models train-packing: error: {exc}", file=sys.stderr)
        return 2
    problem = _promotion_registry(args)
    if problem:
        print(f"lucid models train-packing: error: {problem}", file=sys.stderr)
        return 2
    catalog = load_packing_catalog(args.catalog)
    tree = PackingTree(args.tiny, args.medium, args.label_source).fit_catalog(catalog)
    X, y = catalog.profiles[list(FEATURES)], tree.catalog_labels(catalog)
    in_sample = pair_quality(catalog, tree.predict(X))
    measured = pair_quality(catalog, y)
    print(f"key: {key.describe()} (model kind {key.model_kind})")
    print(f"configurations: {len(X)}, pairs: {len(catalog.pairs)}, labels: {args.label_source}")
    metrics = {"pair_precision": in_sample.precision, "pair_coverage": in_sample.coverage}
    qualities = [("tree (in-sample)", in_sample)]
    if tree.cross_validated_:
        nested = tree.nested_cv_accuracy(X, y)
        print(f"ccp_alpha {tree.ccp_alpha_:.4f}; CV accuracy {tree.cv_accuracy_:.3f} (nested {nested:.3f}; "
              "paper 0.941)")
        metrics.update(cv_accuracy=tree.cv_accuracy_, nested_cv_accuracy=nested)
        qualities.append(("tree (out-of-fold)", pair_quality(catalog, tree.out_of_fold_labels(X, y))))
    else:
        print(tree.fit_note_)
    print("Gini importances: " + ", ".join(f"{k} {v:.3f}" for k, v in tree.feature_importances_.items()))
    print(tree.export_text())
    for label, q in (*qualities, ("measured labels", measured)):
        print(f"pairs allowed by {label}: {q.allowed}; precision {q.precision:.3f} (paper 0.981), "
              f"coverage {q.coverage:.3f} (paper 0.870)")
    if args.out:
        tree.save_json(args.out)
        print(f"wrote {args.out}")
    if args.png:
        tree.plot(args.png)
        print(f"wrote {args.png}")
    data_hash = file_sha256(Path(args.catalog) / "single_data.csv")[:16] + file_sha256(
        Path(args.catalog) / "colocate_info.csv")[:16]
    _register(args, key.model_kind, tree, kind="packing_tree", training_window=(args.catalog, args.catalog),
              data_hash=data_hash, metrics=metrics,
              params={"tiny": args.tiny, "medium": args.medium, "label_source": args.label_source,
                      "gpu_model": key.gpu_model, "sharing": key.mechanism})
    return 0


def _default_split(index) -> str:
    import pandas as pd

    last = pd.Timestamp(index[-1])
    return str(pd.Timestamp(year=last.year, month=last.month, day=1))


def _train_throughput(args: argparse.Namespace) -> int:
    from lucid_core.models.datasets import file_sha256, load_throughput_series
    from lucid_core.models.throughput import ThroughputModel, evaluate_throughput

    series = load_throughput_series(args.series)
    split = args.validate_from or _default_split(series.index)
    targets = ("submit_gpu_job", "submit_gpu_num") if args.target == "both" else (args.target,)
    print(f"train: slots before {split}; validate: slots from {split} ({args.series})")
    print("| target | slots | EBM MAE | naive last-slot | HGB squared | HGB log target | HGB absolute | fit s |")
    print("|---|---|---|---|---|---|---|---|")
    for target in targets:
        model = ThroughputModel(target, args.interactions, args.bags, args.rounds)
        s = evaluate_throughput(series, target, split, model)
        b = s.baselines
        print(f"| {target} | {s.slots} | {s.model_mae:.3f} | {s.naive_mae:.3f} | {b['hgb_squared']:.3f} | "
              f"{b['hgb_log_target']:.3f} | {b['hgb_absolute']:.3f} | {model.fit_seconds_:.1f} |")
        if args.shapes:
            from lucid_core.models.contributions import plot_shape_functions

            plot_shape_functions(model.ebm_, args.shapes, prefix=target)
        _register(args, target, model, kind="throughput_ebm", training_window=model.train_window_,
                  data_hash=file_sha256(args.series), metrics={"mae": s.model_mae, "naive_mae": s.naive_mae,
                                                                **{f"{k}_mae": v for k, v in b.items()}},
                  params={"interactions": args.interactions, "bags": args.bags, "rounds": args.rounds,
                          "validate_from": split})
    return 0


def load_job_log(path: str | Path):
    """Philly CSV (timestamp, duration, num_gpus, cluster) or a generic log with submit_at/user/name."""
    import pandas as pd

    from lucid_core.models.datasets import load_philly_jobs

    head = pd.read_csv(path, nrows=1)
    if {"timestamp", "num_gpus", "cluster"} <= set(head.columns):
        return load_philly_jobs(path)
    frame = pd.read_csv(path)
    if "submit_at" not in frame:
        frame["submit_at"] = pd.to_datetime(frame["submit_time"], unit="s")
    frame["submit_at"] = pd.to_datetime(frame["submit_at"])
    frame = frame.sort_values("submit_at", kind="stable").reset_index(drop=True)
    frame["submit_time"] = (frame["submit_at"] - frame["submit_at"].min().normalize()).dt.total_seconds()
    for column, default in (("user", None), ("name", ""), ("vc", "default")):
        if column not in frame:
            frame[column] = frame["vc"] if column == "user" and "vc" in frame else default
    if "job_id" not in frame:
        frame["job_id"] = [f"job-{i}" for i in range(len(frame))]
    return frame


def _train_duration(args: argparse.Namespace) -> int:
    import numpy as np

    from lucid_core.models.datasets import file_sha256
    from lucid_core.models.duration import DurationModel, hgb_baseline, score_log

    frame = load_job_log(args.trace)
    test = ((frame["submit_at"] >= args.test_start) & (frame["submit_at"] < args.test_end)).to_numpy()
    if not test.any() or test.all():
        raise SystemExit(f"the test window [{args.test_start}, {args.test_end}) must split {args.trace}")
    y = np.log1p(frame["duration"].astype(float).to_numpy())
    rows = []
    for monotone in (False, True) if args.monotone_gpus else (False,):
        model = DurationModel(outer_bags=args.bags, max_rounds=args.rounds, monotone_gpus=monotone,
                              max_train_rows=args.max_train_rows)
        X = model.prepare(frame, name_source=frame[~test])
        model.fit_design(X[~test], y[~test])
        rows.append((f"EBM{' + monotone GPUs' if monotone else ''}", score_log(y[test], model.predict_log(X[test])),
                     model.fit_seconds_))
    rows.append(("history fallback alone", score_log(y[test], X.loc[test, "history_estimate"].to_numpy()), 0.0))
    rows.append(("HistGradientBoosting", score_log(y[test], hgb_baseline(X[~test], y[~test], X[test])), float("nan")))
    print(f"train {int((~test).sum())} jobs, test {int(test.sum())} submitted [{args.test_start}, {args.test_end})")
    print("| model | R² | Spearman | MAE log-s | fit s |\n|---|---|---|---|---|")
    for name, s, seconds in rows:
        print(f"| {name} | {s.r2:.3f} | {s.spearman:.3f} | {s.mae_log:.3f} | {seconds:.1f} |")
    if args.shapes:
        from lucid_core.models.contributions import plot_shape_functions

        plot_shape_functions(model.ebm_, args.shapes, prefix="duration")
    best = rows[len(rows) - 3]
    _register(args, "duration", model, kind="duration_ebm",
              training_window=(str(frame["submit_at"].min()), str(frame["submit_at"].max())),
              data_hash=file_sha256(args.trace),
              metrics={"r2": best[1].r2, "spearman": best[1].spearman, "mae_log": best[1].mae_log},
              params={"test_start": args.test_start, "test_end": args.test_end, "monotone_gpus": model.monotone_gpus,
                      "max_train_rows": args.max_train_rows})
    return 0


def _eval(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from lucid_core.models.registry import ModelRegistry

    name = args.name or ("submit_gpu_job" if args.kind == "throughput" else args.kind)
    model = ModelRegistry(args.registry).load(name, args.version)
    if args.kind == "packing":
        from lucid_core.models.packing import FEATURES, load_packing_catalog, pair_quality

        catalog = load_packing_catalog(args.data or shared_data_dir() / "lucid_artifact")
        y = model.catalog_labels(catalog)
        pred = model.predict(catalog.profiles[list(FEATURES)])
        q = pair_quality(catalog, pred)
        print(json.dumps({"accuracy": float((pred == y).mean()), "pair_precision": q.precision,
                          "pair_coverage": q.coverage, "allowed_pairs": q.allowed}))
    elif args.kind == "throughput":
        from lucid_core.models.datasets import load_throughput_series
        from lucid_core.models.throughput import slot_features

        default = shared_data_dir() / "venus" / "cluster_throughput_2020-04_2020-08.csv"
        series = load_throughput_series(args.data or default)
        counts = series[model.target].astype(float)
        X = slot_features(counts)
        keep = np.ones(len(X), dtype=bool)
        if args.start:
            keep &= X.index >= pd.Timestamp(args.start)
        if args.end:
            keep &= X.index < pd.Timestamp(args.end)
        truth = counts[keep].to_numpy()
        print(json.dumps({"target": model.target, "slots": int(keep.sum()),
                          "mae": float(np.abs(truth - model.predict_features(X[keep])).mean()),
                          "naive_mae": float(np.abs(truth - X.loc[keep, "lag_1"].to_numpy()).mean())}))
    else:
        from lucid_core.models.duration import score_log

        frame = load_job_log(args.data or shared_data_dir() / "philly" / "philly_jobs_2017-09_2017-11.csv")
        X = model.replay(frame)
        keep = np.ones(len(frame), dtype=bool)
        if args.start:
            keep &= (frame["submit_at"] >= args.start).to_numpy()
        if args.end:
            keep &= (frame["submit_at"] < args.end).to_numpy()
        y = np.log1p(frame["duration"].astype(float).to_numpy())
        s = score_log(y[keep], model.predict_log(X[keep]))
        f = score_log(y[keep], X.loc[keep, "history_estimate"].to_numpy())
        print(json.dumps({"jobs": int(keep.sum()), "r2": s.r2, "spearman": s.spearman, "mae_log": s.mae_log,
                          "fallback_r2": f.r2, "fallback_mae_log": f.mae_log}))
    return 0


def _list(args: argparse.Namespace) -> int:
    from lucid_core.models.registry import ModelRegistry

    if not Path(args.registry).is_dir():  # a mistyped --registry must not read as "no models"
        raise FileNotFoundError(f"no model registry at {args.registry} (models are registered by "
                                "lucid models train-... or the lucid_update_engine DAG)")
    print("| name | version | promoted | kind | trained on | metrics | code |\n|---|---|---|---|---|---|---|")
    for m in ModelRegistry(args.registry).list(args.name):
        metrics = ", ".join(f"{k}={v:.3f}" for k, v in m.metrics.items())
        print(f"| {m.name} | {m.version} | {'yes' if m.promoted else ''} | {m.kind} | "
              f"{m.training_window[0]} .. {m.training_window[1]} | {metrics} | {m.code_version} |")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from lucid_core.models.registry import ModelRegistry

    print(f"| metric | v{args.a} | v{args.b} |\n|---|---|---|")
    for k, (a, b) in ModelRegistry(args.registry).compare(args.name, args.a, args.b).items():
        print(f"| {k} | {'' if a is None else f'{a:.4f}'} | {'' if b is None else f'{b:.4f}'} |")
    return 0


def _promote(args: argparse.Namespace) -> int:
    from lucid_core.models.registry import ModelRegistry

    ModelRegistry(args.registry).promote(args.name, args.version)
    print(f"promoted {args.name} v{args.version}")
    return 0


def default_artifacts_dir() -> Path:
    """Where the shipped default artifacts live (include/models)."""
    return REPO_ROOT / "include" / "models"
