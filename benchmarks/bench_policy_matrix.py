"""Policy matrix: every window x cluster size x policy on the shared Philly trace, in one command.

    nice -n 5 .venv/bin/python benchmarks/bench_policy_matrix.py            # the full matrix
    .venv/bin/python benchmarks/bench_policy_matrix.py --quick              # 2 windows x 2 sizes
    .venv/bin/python benchmarks/bench_policy_matrix.py --set orchestrator.guard_slowdown=8

Windows: every full Monday..Sunday week of the file from 2017-09-11, plus 2017-11-01..14. Sizes:
72, 54, 40, 32 nodes of 8 GPUs; baselines FIFO, SJF (oracle), QSSF (and with backfilling),
Tiresias and Horus (reported, not part of the check). Each simulation runs in its own worker process (`--jobs`, default
2); the trace is read once per worker and window. Every policy runs with the default
configuration (`--set` overrides apply to every policy, for experiments). Prints, per window and
size, avg JCT, P99.9 JCT, avg and P99.9 queueing of every policy and best-baseline / Lucid ratios,
then whether the issue-20 conditions hold. Reads ../shared/data (or $LUCID_SHARED_DATA).
"""

from __future__ import annotations

import argparse
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
# Horus (issue 13) is a simulation-only peer (it needs each job's model graph), reported beside
# the others but not part of the issue-20 check, which names FIFO, QSSF and Tiresias
BASELINES = ("fifo", "sjf", "qssf", "qssf-backfill", "tiresias", "horus")
PEERS = ("fifo", "qssf", "qssf-backfill", "tiresias")  # the deployable baselines Lucid must beat
TAIL_PEERS = ("qssf", "qssf-backfill", "tiresias")
ABLATIONS = ("lucid-nosharing", "lucid-noprofiler", "lucid-noestimator", "lucid-fixedtprof")
POLICIES = (*BASELINES, "lucid", *ABLATIONS)
QUICK_WINDOWS = (("2017-10-02", "2017-10-09"), ("2017-11-01", "2017-11-15"))
QUICK_SIZES = (54, 32)
METRICS = ("avg_jct_h", "p999_jct_h", "avg_queue_h", "p999_queue_h")
NONTRIVIAL_QUEUE_SHARE = 0.05  # a cell counts when FIFO's avg queueing exceeds 5% of its avg JCT
SJF_SHARE = 0.8  # Lucid must match SJF-oracle's avg JCT in at least this share of cells
OPTIONAL = ("horus",)  # a cell is reported without these when they were not simulated yet


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


def run_cell(start: str, end: str, nodes: int, policies: Sequence[str],
             overrides: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, dict[str, float], float]]:
    """Every policy on one window and size, in one worker process (the trace is read once)."""
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import load_experiment, run_policy

    config = LucidConfig().with_overrides(dict(overrides)) if overrides else LucidConfig()
    exp, _ = load_experiment(PHILLY, "philly", start, end, nodes=nodes,
                             catalog=WorkloadCatalog.from_artifact(CATALOG), config=config)
    out = []
    for policy in policies:
        started = time.perf_counter()
        _, metrics = run_policy(policy, exp)
        keep = {k: float(metrics[k]) for k in (*METRICS, "jobs", "wall_s")}
        out.append((policy, keep, time.perf_counter() - started))
    return out


def load_results(path: str | None) -> dict[tuple[str, int, str], dict[str, float]]:
    """Figures saved by an earlier (possibly interrupted) run with --json."""
    if not path or not Path(path).is_file():
        return {}
    out = {}
    for key, metrics in json.loads(Path(path).read_text()).items():
        window, nodes, policy = key.split("|")
        out[(window, int(nodes), policy)] = metrics
    return out


def save_results(path: str | None, results: dict[tuple[str, int, str], dict[str, float]]) -> None:
    if path:
        Path(path).write_text(json.dumps({f"{w}|{n}|{p}": m for (w, n, p), m in results.items()}, indent=1))


def run_matrix(windows: Sequence[tuple[str, str]], sizes: Sequence[int], policies: Sequence[str],
               overrides: dict[str, str], workers: int,
               json_path: str | None = None) -> dict[tuple[str, int, str], dict[str, float]]:
    """Every (window, size, policy) simulation: one task per window and size, over worker processes.
    With `json_path`, figures already there are reused and every finished cell is saved at once."""
    ov = tuple(sorted(overrides.items()))
    results = load_results(json_path) if not overrides else {}
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
        futures = {pool.submit(run_cell, s, e, n, todo[(s, e, n)], ov): (s, e, n) for s, e, n in cells}
        for future in as_completed(futures):
            s, e, n = futures[future]
            seconds = 0.0
            for policy, metrics, took in future.result():
                results[(f"{s}..{e}", n, policy)] = metrics
                seconds += took
            if not overrides:
                save_results(json_path, results)
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


def verdict(windows: Sequence[str], sizes: Sequence[int], results: dict[tuple[str, int, str], dict[str, float]],
            present: set[tuple[str, int]] | None = None) -> tuple[list[str], bool]:
    """The Done-when conditions over the non-trivial cells: lines of a summary and pass/fail."""
    rows = [f"{'window':<24} {'nodes':>5} {'FIFO q/JCT':>10} {'Lucid':>7} {'best peer':>9} {'SJF':>7} "
            f"{'Lucid q99.9':>11} {'QSSF':>7} {'Tiresias':>8}  verdict"]
    counted = beat_sjf = horus_cells = beat_horus = 0
    failures: list[str] = []
    for w in windows:
        for n in sizes:
            if present is not None and (w, n) not in present:
                continue

            def get(p: str, k: str, w: str = w, n: int = n) -> float:
                return results[(w, n, p)][k]

            fifo_share = get("fifo", "avg_queue_h") / get("fifo", "avg_jct_h")
            lucid, sjf = get("lucid", "avg_jct_h"), get("sjf", "avg_jct_h")
            best = min(get(p, "avg_jct_h") for p in PEERS)
            lq = get("lucid", "p999_queue_h")
            qq = min(get(p, "p999_queue_h") for p in ("qssf", "qssf-backfill"))
            tq = get("tiresias", "p999_queue_h")
            if fifo_share <= NONTRIVIAL_QUEUE_SHARE:
                note = "trivial (not counted)"
            else:
                counted += 1
                problems = []
                if lucid > best + 1e-9:
                    problems.append(f"avg JCT {lucid / best:.3f}x best baseline")
                if lq > qq + 1e-9:
                    problems.append(f"P99.9 queue {lq / qq:.2f}x QSSF")
                if lq > tq + 1e-9:
                    problems.append(f"P99.9 queue {lq / tq:.2f}x Tiresias")
                if lucid <= sjf + 1e-9:
                    beat_sjf += 1
                note = "ok" if not problems else "FAIL: " + "; ".join(problems)
                if problems:
                    failures.append(f"{w} @{n}: " + "; ".join(problems))
                if lucid > sjf + 1e-9:
                    note += f" (SJF better: {lucid / sjf:.3f}x)"
                if (w, n, "horus") in results:
                    horus_cells += 1
                    beat_horus += lucid <= get("horus", "avg_jct_h") + 1e-9
            rows.append(f"{w:<24} {n:>5} {fifo_share:10.1%} {lucid:7.2f} {best:9.2f} {sjf:7.2f} {lq:11.1f} "
                        f"{qq:7.1f} {tq:8.1f}  {note}")
    sjf_ok = counted == 0 or beat_sjf >= SJF_SHARE * counted
    rows.append(f"non-trivial cells: {counted}; Lucid <= best of FIFO/QSSF(both)/Tiresias avg JCT and "
                f"P99.9 queue <= QSSF (both) and Tiresias: {counted - len(failures)}/{counted}; "
                f"Lucid <= SJF-oracle avg JCT: {beat_sjf}/{counted} "
                f"(need >= {SJF_SHARE:.0%}: {'ok' if sjf_ok else 'FAIL'})")
    if horus_cells:
        rows.append(f"(not a condition) Lucid <= Horus avg JCT: {beat_horus}/{horus_cells}")
    passed = not failures and sjf_ok
    rows.append("DONE-WHEN: " + ("PASS" if passed else "FAIL"))
    return rows, passed


def markdown_table(windows: Sequence[str], sizes: Sequence[int], policies: Sequence[str],
                   results: dict[tuple[str, int, str], dict[str, float]], present: set[tuple[str, int]]) -> str:
    """One row per window and size: every policy's avg JCT, then P99.9 queueing of the tail peers."""
    avg_cols = [p for p in policies if p != "lucid"]
    head = (["window", "nodes", "FIFO q/JCT", *[f"{p} avg JCT h" for p in avg_cols], "lucid avg JCT h",
             "best peer / lucid", "lucid P99.9 q h", "qssf P99.9 q h", "tiresias P99.9 q h",
             *(["horus P99.9 q h"] if "horus" in policies else [])])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in windows:
        for n in sizes:
            if (w, n) not in present:
                continue
            r = {p: results[(w, n, p)] for p in policies if (w, n, p) in results}
            best = min(r[p]["avg_jct_h"] for p in PEERS)
            qssf_tail = min(r[p]["p999_queue_h"] for p in ("qssf", "qssf-backfill"))
            share = r["fifo"]["avg_queue_h"] / r["fifo"]["avg_jct_h"]
            lines.append("| " + " | ".join([
                w, str(n), f"{share:.0%}", *[f"{r[p]['avg_jct_h']:.2f}" if p in r else "-" for p in avg_cols],
                f"**{r['lucid']['avg_jct_h']:.2f}**", f"{best / r['lucid']['avg_jct_h']:.2f}x",
                f"{r['lucid']['p999_queue_h']:.1f}", f"{qssf_tail:.1f}",
                f"{r['tiresias']['p999_queue_h']:.1f}",
                *([f"{r['horus']['p999_queue_h']:.1f}" if "horus" in r else "-"]
                  if "horus" in policies else [])]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="development subset: 2017-10-02 week and Nov 1-14, 54 and 32 nodes, no ablations")
    parser.add_argument("--windows", help="comma-separated START..END (default: every full week + Nov 1-14)")
    parser.add_argument("--sizes", help="comma-separated node counts (default 72,54,40,32)")
    parser.add_argument("--policies", help=f"comma-separated (default {','.join(POLICIES)}); the four "
                                           "baselines and lucid are always run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                        help="override a knob for every policy (experiments only; the matrix uses defaults)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--markdown", action="store_true", help="also print one markdown table of the matrix")
    parser.add_argument("--report-only", action="store_true",
                        help="print the cells already in --json without simulating the missing ones")
    parser.add_argument("--json", help="keep every figure in this JSON file, saved after each cell; figures "
                                       "already in it are reused (resume), unless --set is given")
    args = parser.parse_args(argv)

    windows = QUICK_WINDOWS if args.quick else all_windows()
    if args.windows:
        windows = [tuple(w.split("..")) for w in args.windows.split(",")]  # type: ignore[misc]
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    policies: tuple[str, ...] = (*BASELINES, "lucid") if args.quick else POLICIES
    if args.policies:
        extra = [p.strip() for p in args.policies.split(",") if p.strip()]
        policies = tuple(dict.fromkeys([*BASELINES, "lucid", *extra]))
    overrides = dict(item.split("=", 1) for item in args.set)
    started = time.perf_counter()
    if args.report_only:
        results = load_results(args.json)
        have = {(w, n) for w, n, p in results if all((w, n, q) in results for q in required(policies))}
        windows = [(s, e) for s, e in windows if any((f"{s}..{e}", n) in have for n in sizes)]
        sizes = tuple(n for n in sizes if any((f"{s}..{e}", n) in have for s, e in windows))
        missing = [(w, n) for w in (f"{s}..{e}" for s, e in windows) for n in sizes if (w, n) not in have]
        if missing:
            print(f"# not simulated yet (left out): {missing}")
    else:
        results = run_matrix(windows, sizes, policies, overrides, args.jobs, args.json)
    wall = time.perf_counter() - started
    names = [f"{s}..{e}" for s, e in windows]
    print(f"# Policy matrix: Philly, {len(names)} windows x {len(sizes)} sizes x {len(policies)} policies"
          + (f"; overrides {overrides}" if overrides else "; default configuration"))
    print("x: policy / Lucid (above 1.00x: Lucid is better)\n")
    present = {(w, n) for w in names for n in sizes if all((w, n, p) in results for p in required(policies))}
    for w in names:
        for n in sizes:
            if (w, n) not in present:
                continue
            print(cell_table(w, n, policies, results))
            fifo = results[(w, n, "fifo")]
            lucid = results[(w, n, "lucid")]
            best = min(PEERS, key=lambda p: results[(w, n, p)]["avg_jct_h"])
            bq = min(TAIL_PEERS, key=lambda p: results[(w, n, p)]["p999_queue_h"])
            print(f"  best baseline / Lucid: avg JCT {results[(w, n, best)]['avg_jct_h'] / lucid['avg_jct_h']:.2f}x "
                  f"({best}); P99.9 queue {results[(w, n, bq)]['p999_queue_h'] / max(lucid['p999_queue_h'], 1e-9):.2f}x"
                  f" ({bq}); FIFO avg queue / avg JCT {fifo['avg_queue_h'] / fifo['avg_jct_h']:.1%}\n")
    if args.markdown:
        print(markdown_table(names, sizes, policies, results, present))
    rows, passed = verdict(names, sizes, results, present)
    print("## Done-when check\n" + "\n".join(rows))
    sims = len(results)
    print(f"\n{sims} simulations in {wall:.0f} s wall with {args.jobs} worker processes")
    if overrides:
        save_results(args.json, results)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
