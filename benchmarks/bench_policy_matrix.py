"""Policy matrix: every window x cluster size x policy on the shared Philly trace, in one command.

    nice -n 5 .venv/bin/python benchmarks/bench_policy_matrix.py            # the full matrix
    .venv/bin/python benchmarks/bench_policy_matrix.py --quick              # the contended cells, to iterate
    .venv/bin/python benchmarks/bench_policy_matrix.py --ablations          # with Lucid's ablations (share 0)
    .venv/bin/python benchmarks/bench_policy_matrix.py --holdout            # windows and sizes never tuned on
    .venv/bin/python benchmarks/bench_policy_matrix.py --set orchestrator.guard_slowdown=8

Windows: every full Monday..Sunday week of the file from 2017-09-11, plus 2017-11-01..14. Sizes:
72, 54, 40, 32 nodes of 8 GPUs. Lucid runs at three preemptible shares, side by side: `lucid` (share 0,
what a cluster of ordinary jobs gets: nobody yields), `lucid@0.5` and `lucid@1` (that share of the jobs,
drawn by job id, resume from checkpoints and may yield). Baselines FIFO, SJF (oracle), QSSF (and with
backfilling), Tiresias (which preempts every job, as if all checkpointed) and Horus do not depend on the
share: each runs once per window and size and is cached by window, size, overrides and the hash of the code it
runs (`--cache`, default out/matrix_baselines.json), so a policy change reruns Lucid only.

Each window and size runs in a worker process (`--jobs`, default 2); a worker parses the trace once. Every
policy runs with the default configuration (`--set` overrides apply to every policy, for experiments).
Prints, per window and size, avg JCT, P99.9 JCT, avg and P99.9 queueing of every policy and its ratio to
Lucid, then the issue-35 check. Reads ../shared/data (or $LUCID_SHARED_DATA).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout, or beside a folder above it (a worktree in a subfolder)
DATA = Path(os.environ.get("LUCID_SHARED_DATA") or next(
    (p / "shared" / "data" for p in REPO.parents if (p / "shared" / "data").is_dir()), REPO.parent / "shared" / "data"))
PHILLY = DATA / "philly" / "philly_jobs_2017-09_2017-11.csv"
CATALOG = DATA / "lucid_artifact"

SIZES = (72, 54, 40, 32)
# Horus (issue 13) is a simulation-only peer that is handed each job's profile at submission
BASELINES = ("fifo", "sjf", "qssf", "qssf-backfill", "tiresias", "horus")
NON_PREEMPTIVE_PEERS = ("fifo", "qssf", "qssf-backfill")  # what Lucid at share 0 must beat on avg JCT
TAIL_PEERS = ("qssf", "qssf-backfill")  # Lucid at share 0's P99.9 queueing must be at most theirs
SHARES = (0.0, 0.5, 1.0)  # preemptible shares Lucid runs at: `lucid`, `lucid@0.5`, `lucid@1`
LUCIDS = ("lucid", "lucid@0.5", "lucid@1")
ABLATIONS = ("lucid-nosharing", "lucid-noprofiler", "lucid-noestimator", "lucid-fixedtprof")
POLICIES = (*BASELINES, *LUCIDS)
#: the development subset: the windows where the non-intrusive Lucid lost, at their contended sizes
QUICK_WINDOWS = (("2017-09-25", "2017-10-02"), ("2017-11-01", "2017-11-15"), ("2017-11-13", "2017-11-20"))
QUICK_SIZES = (54, 32)
#: a check no default was tuned on: 10-day windows from Wednesdays, at three sizes the matrix does not run
HOLDOUT_WINDOWS = (("2017-09-20", "2017-09-30"), ("2017-10-04", "2017-10-14"), ("2017-10-18", "2017-10-28"),
                   ("2017-11-01", "2017-11-11"), ("2017-11-15", "2017-11-25"))
HOLDOUT_SIZES = (64, 48, 36)
METRICS = ("avg_jct_h", "p999_jct_h", "avg_queue_h", "p999_queue_h")
NONTRIVIAL_QUEUE_SHARE = 0.05  # a cell counts when FIFO's avg queueing exceeds 5% of its avg JCT
SJF_SHARE = 0.6  # Lucid at share 0 must match SJF-oracle's avg JCT in at least this share of cells
HORUS_SHARE = 26 / 39  # ... and Horus's (handed exact profiles) in at least this share
OPTIONAL = ("horus",)  # a cell is reported without these when they were not simulated yet
#: the modules whose code decides a baseline's figures (their imports are followed; experiment.py is not,
#: since it imports Lucid too): a change elsewhere keeps the cached baselines
BASELINE_ROOTS = ("lucid_core.policy.baselines", "lucid_core.policy.horus", "lucid_core.sim.engine",
                  "lucid_core.sim.metrics", "lucid_core.sim.catalog", "lucid_core.sim.traces")


def split_share(policy: str) -> tuple[str, float | None]:
    """`lucid@0.5` -> ("lucid", 0.5); a name without a share -> (name, None): as the trace says (none)."""
    name, _, share = policy.partition("@")
    return name, (float(share) if share else None)


def baseline_code_hash(repo: Path = REPO) -> str:
    """A hash of the source the baselines run: BASELINE_ROOTS and every lucid_core module they import."""
    seen: set[str] = set()
    todo = list(BASELINE_ROOTS)
    digest = hashlib.sha256()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = repo / (module.replace(".", "/") + ".py")
        if not path.is_file():
            continue
        source = path.read_bytes()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lucid_core"):
                todo.append(node.module)
                todo += [f"{node.module}.{alias.name}" for alias in node.names]
    for module in sorted(seen):
        path = repo / (module.replace(".", "/") + ".py")
        if path.is_file():
            digest.update(module.encode() + b"\0" + path.read_bytes())
    digest.update((repo / "lucid_core" / "sim" / "experiment.py").read_bytes())
    return digest.hexdigest()[:16]


def required(policies: Sequence[str]) -> list[str]:
    """The policies a cell needs before it is reported (the check's own policies)."""
    return [p for p in policies if p not in OPTIONAL]


def full_weeks(first: date = date(2017, 9, 11), last_submit: date = date(2017, 11, 30)) -> list[tuple[str, str]]:
    """Monday..Sunday windows [start, start + 7 d) from `first` that end within the file."""
    out, start = [], first
    while start + timedelta(days=6) <= last_submit:
        out.append((start.isoformat(), (start + timedelta(days=7)).isoformat()))
        start += timedelta(days=7)
    return out


def all_windows() -> list[tuple[str, str]]:
    return [*full_weeks(), ("2017-11-01", "2017-11-15")]


@dataclass(frozen=True)
class Task:
    start: str
    end: str
    nodes: int
    policy: str
    overrides: tuple[tuple[str, str], ...] = ()


def run_task(task: Task) -> tuple[Task, dict[str, float], float]:
    """One simulation (reads the window itself)."""
    (_, metrics, seconds), = run_cell(task.start, task.end, task.nodes, (task.policy,), task.overrides)
    return task, metrics, seconds


_WORKER_INPUTS: dict[str, object] = {}  # this worker process's parsed trace and catalog, read once


def _inputs() -> tuple[object, object]:
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.traces import parse_trace

    if not _WORKER_INPUTS:
        _WORKER_INPUTS["trace"] = parse_trace(PHILLY, "philly")
        _WORKER_INPUTS["catalog"] = WorkloadCatalog.from_artifact(CATALOG)
    return _WORKER_INPUTS["trace"], _WORKER_INPUTS["catalog"]


def run_cell(start: str, end: str, nodes: int, policies: Sequence[str],
             overrides: tuple[tuple[str, str], ...] = (),
             lucid_overrides: tuple[tuple[str, str], ...] = (),
             seed: int = 0) -> list[tuple[str, dict[str, float], float]]:
    """Every policy on one window and size, in one worker process (which parses the trace once).
    `lucid_overrides` apply to Lucid and its ablations only (the baselines stay as cached); `seed`: the
    catalog's draw of a workload per job (and QSSF's noise), 0 as in every committed figure."""
    from dataclasses import replace

    from lucid_core.config import LucidConfig
    from lucid_core.sim.experiment import load_experiment, run_policy
    from lucid_core.sim.records import with_preemptible_share

    config = LucidConfig().with_overrides(dict(overrides)) if overrides else LucidConfig()
    trace, catalog = _inputs()
    exp, _ = load_experiment(trace, "philly", start, end, nodes=nodes, catalog=catalog, config=config, seed=seed)
    out = []
    for policy in policies:
        started = time.perf_counter()
        name, share = split_share(policy)
        run_on = exp if share is None else replace(exp, records=with_preemptible_share(exp.records, share))
        if lucid_overrides and name.startswith("lucid"):
            run_on = replace(run_on, config=run_on.config.with_overrides(dict(lucid_overrides)))
        _, metrics = run_policy(name, run_on)
        keep = {k: float(metrics[k]) for k in (*METRICS, "jobs", "wall_s", "preemptions")}
        out.append((policy, keep, time.perf_counter() - started))
    return out


#: the key of a results file's own entry saying what produced it (absent in files from the default run)
RUN_KEY = "_run"


def run_label(overrides: dict[str, str], lucid_overrides: dict[str, str], seed: int) -> dict[str, object]:
    """What a results file's figures depend on besides the code: they are reused only under the same label."""
    return {"overrides": dict(sorted(overrides.items())), "lucid_overrides": dict(sorted(lucid_overrides.items())),
            "seed": seed}


DEFAULT_LABEL = run_label({}, {}, 0)


def load_results(path: str | None,
                 label: dict[str, object] | None = None) -> dict[tuple[str, int, str], dict[str, float]]:
    """Figures saved by an earlier (possibly interrupted) run with --json, if it ran under the same `label`
    (overrides and seed; default: the default run's): figures of another run are not this run's."""
    if not path or not Path(path).is_file():
        return {}
    saved = json.loads(Path(path).read_text())
    kept = saved.pop(RUN_KEY, DEFAULT_LABEL)
    if kept != (label or DEFAULT_LABEL):
        print(f"{path} holds figures of another run ({kept}): not reused", file=sys.stderr)
        return {}
    out = {}
    for key, metrics in saved.items():
        window, nodes, policy = key.split("|")
        out[(window, int(nodes), policy)] = metrics
    return out


def save_results(path: str | None, results: dict[tuple[str, int, str], dict[str, float]],
                 label: dict[str, object] | None = None) -> None:
    """Every figure by window|nodes|policy, with the run's label unless it is the default run's."""
    if path:
        out: dict[str, object] = {} if label in (None, DEFAULT_LABEL) else {RUN_KEY: label}
        out.update({f"{w}|{n}|{p}": m for (w, n, p), m in results.items()})
        Path(path).write_text(json.dumps(out, indent=1))


def cache_key(window: str, nodes: int, policy: str, overrides: tuple[tuple[str, str], ...], code: str) -> str:
    return f"{code}|{window}|{nodes}|{policy}|{json.dumps(overrides)}"


def load_cache(path: str | None) -> dict[str, dict[str, float]]:
    if not path or not Path(path).is_file():
        return {}
    try:
        return json.loads(Path(path).read_text())
    except ValueError:  # a cache cut short: start again
        return {}


def run_matrix(windows: Sequence[tuple[str, str]], sizes: Sequence[int], policies: Sequence[str],
               overrides: dict[str, str], workers: int, json_path: str | None = None,
               cache_path: str | None = None,
               lucid_overrides: dict[str, str] | None = None,
               seed: int = 0) -> dict[tuple[str, int, str], dict[str, float]]:
    """Every (window, size, policy) simulation: one task per window and size, over worker processes.
    With `json_path`, figures a run with the same overrides and seed left there are reused, and every finished
    cell is saved at once. Baselines
    come from `cache_path` when the same code ran them on the same cell and overrides."""
    ov = tuple(sorted(overrides.items()))
    lov = tuple(sorted((lucid_overrides or {}).items()))
    label = run_label(overrides, dict(lov), seed)
    results = load_results(json_path, label)
    keyed = ov + ((("seed", str(seed)),) if seed else ())  # the cache key: seed 0 keeps the keys it always had
    code = baseline_code_hash()
    cache = load_cache(cache_path)
    reused = 0
    for s, e in windows:
        for n in sizes:
            for p in policies:
                hit = cache.get(cache_key(f"{s}..{e}", n, p, keyed, code)) if p in BASELINES else None
                if hit is not None and (f"{s}..{e}", n, p) not in results:
                    results[(f"{s}..{e}", n, p)] = hit
                    reused += 1
    if reused:
        print(f"{reused} baseline figures reused from {cache_path} (code {code})", file=sys.stderr)
    todo: dict[tuple[str, str, int], list[str]] = {}
    for s, e in windows:
        for n in sizes:
            missing = [p for p in policies if (f"{s}..{e}", n, p) not in results]
            if missing:
                todo[(s, e, n)] = missing
    # smallest clusters first: they are the slowest cells, so the pool ends evenly
    cells = sorted(todo, key=lambda c: c[2])
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_cell, s, e, n, todo[(s, e, n)], ov, lov, seed): (s, e, n) for s, e, n in cells}
        for future in as_completed(futures):
            s, e, n = futures[future]
            seconds = 0.0
            for policy, metrics, took in future.result():
                results[(f"{s}..{e}", n, policy)] = metrics
                seconds += took
                if policy in BASELINES and cache_path:
                    cache[cache_key(f"{s}..{e}", n, policy, keyed, code)] = metrics
            save_results(json_path, results, label)
            if cache_path:
                Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
                Path(cache_path).write_text(json.dumps(cache, indent=0))
            done += 1
            lucid = results[(f"{s}..{e}", n, "lucid")]
            print(f"[{done}/{len(cells)}] {s}..{e} {n:>3} nodes: {len(todo[(s, e, n)])} policies in {seconds:5.1f} s;"
                  f" Lucid avg JCT {lucid['avg_jct_h']:.2f} h", file=sys.stderr, flush=True)
    return results


def cell_table(window: str, nodes: int, policies: Sequence[str],
               results: dict[tuple[str, int, str], dict[str, float]]) -> str:
    """One block: a row per policy, its four figures and its ratio to Lucid."""
    lucid = results[(window, nodes, "lucid")]
    lines = [f"{window}  {nodes} nodes  ({int(lucid['jobs'])} jobs)",
             f"  {'policy':<17} {'avg JCT h':>9} {'x':>6} {'P99.9 JCT':>9} {'x':>6} {'avg q h':>8} {'x':>6} "
             f"{'P99.9 q h':>9} {'x':>6}"]
    for p in policies:
        if (window, nodes, p) not in results:
            continue
        m = results[(window, nodes, p)]
        cells = []
        for k in METRICS:
            ratio = m[k] / lucid[k] if lucid[k] > 0 else float("inf") if m[k] > 0 else 1.0
            cells.append((m[k], ratio))
        lines.append(f"  {p:<17} {cells[0][0]:9.2f} {cells[0][1]:5.2f}x {cells[1][0]:9.1f} {cells[1][1]:5.2f}x "
                     f"{cells[2][0]:8.3f} {cells[2][1]:5.2f}x {cells[3][0]:9.1f} {cells[3][1]:5.2f}x")
    return "\n".join(lines)


def _get(results: dict[tuple[str, int, str], dict[str, float]], w: str, n: int, p: str, k: str) -> float:
    return results[(w, n, p)][k]


#: a float tolerance on every condition of the check
TIE = 1e-9


def share0_conditions(lucid: dict[str, float], base: dict[str, dict[str, float]]) -> dict[str, bool]:
    """Issue 35's share-0 conditions in one cell, from Lucid's figures and the baselines' (by policy name):
    avg JCT at most the best non-preemptive policy's, SJF-oracle's and Horus's (when Horus ran), P99.9 queueing
    at most the QSSFs'."""
    best = min(base[p]["avg_jct_h"] for p in NON_PREEMPTIVE_PEERS)
    tail = min(base[p]["p999_queue_h"] for p in TAIL_PEERS)
    met = {"avg <= best non-preemptive": lucid["avg_jct_h"] <= best + TIE,
           "avg <= SJF": lucid["avg_jct_h"] <= base["sjf"]["avg_jct_h"] + TIE}
    if "horus" in base:
        met["avg <= Horus"] = lucid["avg_jct_h"] <= base["horus"]["avg_jct_h"] + TIE
    met["P99.9 queue <= QSSF"] = lucid["p999_queue_h"] <= tail + TIE
    return met


def verdict(windows: Sequence[str], sizes: Sequence[int], results: dict[tuple[str, int, str], dict[str, float]],
            present: set[tuple[str, int]] | None = None) -> tuple[list[str], bool]:
    """The issue-35 conditions over the non-trivial cells: lines of a summary and pass/fail.

    Lucid at share 0 (nobody yields): avg JCT at most the best of FIFO, QSSF and QSSF-backfill and P99.9
    queueing at most both QSSFs' in every cell, avg JCT at most SJF-oracle's in SJF_SHARE of the cells and at
    most Horus's in HORUS_SHARE. Lucid at share 1: avg JCT at most Tiresias's in every cell; its P99.9
    queueing against Tiresias's is counted, not required."""
    rows = [f"{'window':<24} {'nodes':>5} {'FIFO q/JCT':>10} {'L@0':>6} {'best np':>7} {'SJF':>6} {'Horus':>6} "
            f"{'L@0 q99.9':>9} {'QSSF q':>7} {'L@1':>6} {'Tires.':>6} {'L@1 q99.9':>9} {'Tir. q':>7}  verdict"]
    counted = beat_sjf = beat_horus = horus_cells = tail_vs_tiresias = 0
    failures: list[str] = []
    for w in windows:
        for n in sizes:
            if present is not None and (w, n) not in present:
                continue

            def get(p: str, k: str, w: str = w, n: int = n) -> float:
                return _get(results, w, n, p, k)

            fifo_share = get("fifo", "avg_queue_h") / get("fifo", "avg_jct_h")
            l0, sjf = get("lucid", "avg_jct_h"), get("sjf", "avg_jct_h")
            best = min(get(p, "avg_jct_h") for p in NON_PREEMPTIVE_PEERS)
            lq, qq = get("lucid", "p999_queue_h"), min(get(p, "p999_queue_h") for p in TAIL_PEERS)
            has_one = (w, n, "lucid@1") in results
            l1 = get("lucid@1", "avg_jct_h") if has_one else float("nan")
            l1q = get("lucid@1", "p999_queue_h") if has_one else float("nan")
            ta, tq = get("tiresias", "avg_jct_h"), get("tiresias", "p999_queue_h")
            horus = get("horus", "avg_jct_h") if (w, n, "horus") in results else float("nan")
            if fifo_share <= NONTRIVIAL_QUEUE_SHARE:
                note = "trivial (not counted)"
            else:
                counted += 1
                met = share0_conditions(results[(w, n, "lucid")], {p: results[(w, n, p)] for p in BASELINES
                                                                   if (w, n, p) in results})
                problems = []
                if not met["avg <= best non-preemptive"]:
                    problems.append(f"share 0 avg JCT {l0 / best:.3f}x best non-preemptive")
                if not met["P99.9 queue <= QSSF"]:
                    problems.append(f"share 0 P99.9 queue {lq / qq:.2f}x QSSF")
                if has_one and l1 > ta + TIE:
                    problems.append(f"share 1 avg JCT {l1 / ta:.3f}x Tiresias")
                beat_sjf += met["avg <= SJF"]
                if "avg <= Horus" in met:
                    horus_cells += 1
                    beat_horus += met["avg <= Horus"]
                tail_vs_tiresias += has_one and l1q <= tq + TIE
                note = "ok" if not problems else "FAIL: " + "; ".join(problems)
                if problems:
                    failures.append(f"{w} @{n}: " + "; ".join(problems))
            rows.append(f"{w:<24} {n:>5} {fifo_share:10.1%} {l0:6.2f} {best:7.2f} {sjf:6.2f} {horus:6.2f} "
                        f"{lq:9.1f} {qq:7.1f} {l1:6.2f} {ta:6.2f} {l1q:9.1f} {tq:7.1f}  {note}")
    sjf_ok = counted == 0 or beat_sjf >= SJF_SHARE * counted - TIE
    horus_ok = horus_cells == 0 or beat_horus >= HORUS_SHARE * horus_cells - TIE
    rows.append(f"non-trivial cells: {counted}; every condition of every cell: {counted - len(failures)}/{counted}")
    rows.append(f"share 0: avg JCT <= SJF-oracle in {beat_sjf}/{counted} (need {SJF_SHARE:.0%}: "
                f"{'ok' if sjf_ok else 'FAIL'}); <= Horus in {beat_horus}/{horus_cells} (need "
                f"{HORUS_SHARE * 39:.0f} of 39: {'ok' if horus_ok else 'FAIL'})")
    rows.append(f"share 1: P99.9 queueing <= Tiresias's in {tail_vs_tiresias}/{counted} (counted, not required)")
    passed = not failures and sjf_ok and horus_ok
    rows.append("DONE-WHEN: " + ("PASS" if passed else "FAIL"))
    return rows, passed


def markdown_table(windows: Sequence[str], sizes: Sequence[int], policies: Sequence[str],
                   results: dict[tuple[str, int, str], dict[str, float]], present: set[tuple[str, int]]) -> str:
    """One row per window and size: every policy's avg JCT, then the P99.9 queueing of Lucid and the tail peers."""
    tails = [p for p in ("lucid", "lucid@0.5", "lucid@1", "qssf", "qssf-backfill", "tiresias") if p in policies]
    head = ["window", "nodes", "FIFO q/JCT", *[f"{p} avg JCT h" for p in policies], "best non-preemptive / lucid",
            *[f"{p} P99.9 q h" for p in tails]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in windows:
        for n in sizes:
            if (w, n) not in present:
                continue
            r = {p: results[(w, n, p)] for p in policies if (w, n, p) in results}
            best = min(r[p]["avg_jct_h"] for p in NON_PREEMPTIVE_PEERS)
            share = r["fifo"]["avg_queue_h"] / r["fifo"]["avg_jct_h"]
            cells = [(f"**{r[p]['avg_jct_h']:.2f}**" if p == "lucid" else f"{r[p]['avg_jct_h']:.2f}") if p in r
                     else "-" for p in policies]
            lines.append("| " + " | ".join([w, str(n), f"{share:.0%}", *cells, f"{best / r['lucid']['avg_jct_h']:.2f}x",
                                            *[f"{r[p]['p999_queue_h']:.1f}" if p in r else "-" for p in tails]]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="development subset: the Sep 25 and Nov 13 weeks and Nov 1-14 at 54 and 32 nodes")
    parser.add_argument("--holdout", action="store_true",
                        help="held-out check: 10-day windows from Wednesdays at 64, 48, 36 nodes, never tuned on")
    parser.add_argument("--ablations", action="store_true", help="also run Lucid's ablations (at share 0)")
    parser.add_argument("--cache", default=str(REPO / "out" / "matrix_baselines.json"),
                        help="baseline figures by window, size, overrides and code hash ('' for none)")
    parser.add_argument("--windows", help="comma-separated START..END (default: every full week + Nov 1-14)")
    parser.add_argument("--sizes", help="comma-separated node counts (default 72,54,40,32)")
    parser.add_argument("--policies", help=f"comma-separated (default {','.join(POLICIES)}); the baselines "
                                           "and the three Lucid shares are always run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                        help="override a knob for every policy (experiments only; the matrix uses defaults)")
    parser.add_argument("--lucid-set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                        help="override a knob for Lucid and its ablations only (baselines reused from the cache)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--seed", type=int, default=0, help=(
        "the catalog's workload draw per job (and QSSF's noise); another seed checks that a verdict does not "
        "hang on one draw (default 0, every committed figure)"))
    parser.add_argument("--markdown", action="store_true", help="also print one markdown table of the matrix")
    parser.add_argument("--report-only", action="store_true",
                        help="print the cells already in --json without simulating the missing ones")
    parser.add_argument("--json", help="keep every figure in this JSON file, saved after each cell with the run's "
                                       "--set, --lucid-set and --seed; a rerun with the same ones reuses them (resume)")
    args = parser.parse_args(argv)

    if args.quick and args.holdout:
        parser.error("--quick and --holdout are two different subsets: choose one")
    windows = QUICK_WINDOWS if args.quick else HOLDOUT_WINDOWS if args.holdout else all_windows()
    if args.windows:
        windows = [tuple(w.split("..")) for w in args.windows.split(",")]  # type: ignore[misc]
    sizes = QUICK_SIZES if args.quick else HOLDOUT_SIZES if args.holdout else SIZES
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    policies: tuple[str, ...] = (*POLICIES, *(ABLATIONS if args.ablations else ()))
    if args.policies:
        extra = [p.strip() for p in args.policies.split(",") if p.strip()]
        policies = tuple(dict.fromkeys([*policies, *extra]))
    overrides = dict(item.split("=", 1) for item in args.set)
    lucid_overrides = dict(item.split("=", 1) for item in args.lucid_set)
    started = time.perf_counter()
    if args.report_only:
        results = load_results(args.json, run_label(overrides, lucid_overrides, args.seed))
        have = {(w, n) for w, n, p in results if all((w, n, q) in results for q in required(policies))}
        windows = [(s, e) for s, e in windows if any((f"{s}..{e}", n) in have for n in sizes)]
        sizes = tuple(n for n in sizes if any((f"{s}..{e}", n) in have for s, e in windows))
        missing = [(w, n) for w in (f"{s}..{e}" for s, e in windows) for n in sizes if (w, n) not in have]
        if missing:
            print(f"# not simulated yet (left out): {missing}")
    else:
        results = run_matrix(windows, sizes, policies, overrides, args.jobs, args.json, args.cache or None,
                             lucid_overrides, args.seed)
    wall = time.perf_counter() - started
    names = [f"{s}..{e}" for s, e in windows]
    print(f"# Policy matrix: Philly, {len(names)} windows x {len(sizes)} sizes x {len(policies)} policies"
          + (f"; overrides {overrides}" if overrides else "; default configuration")
          + (f"; Lucid only: {lucid_overrides}" if lucid_overrides else "")
          + (f"; seed {args.seed}" if args.seed else ""))
    print("x: policy / Lucid (above 1.00x: Lucid is better)\n")
    present = {(w, n) for w in names for n in sizes if all((w, n, p) in results for p in required(policies))}
    for w in names:
        for n in sizes:
            if (w, n) not in present:
                continue
            print(cell_table(w, n, policies, results))
            fifo = results[(w, n, "fifo")]
            lucid = results[(w, n, "lucid")]
            best = min(NON_PREEMPTIVE_PEERS, key=lambda p: results[(w, n, p)]["avg_jct_h"])
            bq = min(TAIL_PEERS, key=lambda p: results[(w, n, p)]["p999_queue_h"])
            print(f"  best non-preemptive / Lucid at share 0: avg JCT "
                  f"{results[(w, n, best)]['avg_jct_h'] / lucid['avg_jct_h']:.2f}x ({best}); P99.9 queue "
                  f"{results[(w, n, bq)]['p999_queue_h'] / max(lucid['p999_queue_h'], 1e-9):.2f}x ({bq}); "
                  f"FIFO avg queue / avg JCT {fifo['avg_queue_h'] / fifo['avg_jct_h']:.1%}\n")
    if args.markdown:
        print(markdown_table(names, sizes, policies, results, present))
    rows, passed = verdict(names, sizes, results, present)
    print("## Done-when check\n" + "\n".join(rows))
    sims = len(results)
    print(f"\n{sims} simulations in {wall:.0f} s wall with {args.jobs} worker processes")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
