"""What the pages read from the GPU hosts, each read bounded by a deadline so a page never hangs on a host:
the last lines of a job's stdout and stderr (as `lucid logs` reads them), and each GPU's latest utilization
sample from the telemetry agents beside the jobs running on it.

Both go through the executor's own reads (`HostExecutor.read` of a run's files); a host that does not answer
in time, or refuses, becomes a sentence the page shows instead of the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from lucid_core.domain import RunState
from lucid_core.runtime.hosts.telemetry import RECORD_BYTES_BOUND, parse_samples
from lucid_core.runtime.surfaces.queries import latest_run

if TYPE_CHECKING:
    from lucid_core.runtime.hosts.executor import FileTail, HostAddress, HostExecutor
    from lucid_core.runtime.store.schema import RunRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.queries import GpuMap

T = TypeVar("T")

#: how long a page waits for the hosts in all (each read's own deadline is the executor's)
READ_DEADLINE_S = 5.0
#: lines of each log the job page shows, and the bytes of its tail read to find them
LOG_LINES = 20
LOG_TAIL_BYTES = 16384
#: samples of each GPU read from a run's telemetry file: its last few lines are the newest
SAMPLES_PER_GPU = 4


def within(calls: Mapping[str, Callable[[], T]], deadline_s: float) -> dict[str, T | BaseException]:
    """One call per host, hosts at once through the round's own `HostCallPool`: each call's result or
    exception; a host still silent past `deadline_s` (and the pool's grace) is given up, its worker left."""
    from lucid_core.runtime.hosts.calls import HostCall, HostCallPool

    if not calls:
        return {}
    pool = HostCallPool(workers=len(calls))
    try:
        results = pool.run({host: [HostCall(call, deadline_s)] for host, call in calls.items()}, limit_s=deadline_s)
    finally:
        pool.close()
    return {host: (result.value if result.error is None else result.error)  # type: ignore[misc]
            for host, (result,) in results.items()}


def read_problem(host: str, error: BaseException) -> str:
    """Why nothing came back from `host`, in a sentence."""
    from lucid_core.runtime.hosts.executor import HostUnreachable

    if isinstance(error, HostUnreachable):
        return f"host {host} is unreachable: {error}"
    return f"reading from host {host} failed: {type(error).__name__}: {error}"


def last_lines(tail: FileTail, lines: int, read_bytes: int) -> str:
    """The last `lines` lines of a file's tail as a terminal leaves them: a line a job rewrote with carriage
    returns (a progress bar) shows its last version; a tail cut at `read_bytes` loses its first, partial line."""
    kept = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in tail.text.split("\n")]
    if kept and kept[-1] == "":
        kept.pop()  # the newline that ends the file
    if tail.cut(read_bytes) and len(kept) > 1:
        kept = kept[1:]
    return "\n".join(kept[-lines:]) if lines > 0 else ""


@dataclass(frozen=True)
class LogTail:
    """The last lines of a job's latest run's stdout and stderr, or why they are not shown (`problem`)."""

    run_id: str | None
    host: str | None
    stdout: str = ""
    stderr: str = ""
    problem: str | None = None


def log_tail(store: Store, executor: HostExecutor, job_id: str, *, lines: int = LOG_LINES,
             read_bytes: int = LOG_TAIL_BYTES, deadline_s: float = READ_DEADLINE_S) -> LogTail:
    """The last `lines` of both logs of the job's latest run, read from its host within `deadline_s`."""
    from lucid_core.runtime.hosts.inventory import host_address

    found = latest_run(store, job_id)
    if found is None:
        return LogTail(None, None, problem="no run of it has started")
    run, host = found
    address = host_address(host)

    def both() -> tuple[FileTail, FileTail]:
        """stdout then stderr, on the host's one connection."""
        return (executor.read_tail(address, run.run_id, "stdout.log", read_bytes),
                executor.read_tail(address, run.run_id, "stderr.log", read_bytes))

    answer = within({host.name: both}, deadline_s)[host.name]
    if isinstance(answer, BaseException):
        return LogTail(run.run_id, host.name, problem=read_problem(host.name, answer))
    out, err = answer
    return LogTail(run.run_id, host.name, last_lines(out, lines, read_bytes), last_lines(err, lines, read_bytes))


@dataclass(frozen=True)
class GpuReading:
    """A GPU's newest telemetry sample (device-wide figures), from the agent beside `job_id`."""

    gpu_util: float
    mem_util: float
    mem_used_mb: float | None
    at: float
    emulated: bool
    job_id: str


@dataclass(frozen=True)
class GpuUtilization:
    """Each GPU's newest sample, by (host, GPU index), and per host why nothing could be read there."""

    readings: dict[tuple[str, int], GpuReading]
    problems: dict[str, str]


def _host_samples(executor: HostExecutor, address: HostAddress, runs: list[RunRow]) -> list[tuple[RunRow, Any]]:
    """Each run's newest samples from its telemetry file on one host (none when it has no agent)."""
    out = []
    for run in runs:
        size = RECORD_BYTES_BOUND * SAMPLES_PER_GPU * max(1, len(run.gpu_indices or []))
        out += [(run, sample) for sample in parse_samples(executor.read(address, run.run_id, "telemetry.jsonl",
                                                                          size))]
    return out


def gpu_utilization(found: GpuMap, executor: HostExecutor, deadline_s: float = READ_DEADLINE_S) -> GpuUtilization:
    """The newest sample of every GPU a running job's telemetry agent watches, all hosts read at once."""
    from lucid_core.runtime.hosts.inventory import host_address

    hosts = {h.name: h for h in found.hosts}
    running: dict[str, list[RunRow]] = {}
    for run in found.runs:
        if run.state == RunState.RUNNING and run.host in hosts and run.gpu_indices:
            running.setdefault(run.host, []).append(run)
    answers = within({name: partial(_host_samples, executor, host_address(hosts[name]), runs)
                      for name, runs in running.items()}, deadline_s)
    readings: dict[tuple[str, int], GpuReading] = {}
    problems: dict[str, str] = {}
    for name, answer in answers.items():
        if isinstance(answer, BaseException):
            problems[name] = read_problem(name, answer)
            continue
        for run, sample in answer:
            key = (name, int(sample.get("gpu", 0)))
            if key[1] not in {int(i) for i in run.gpu_indices} or (key in readings and readings[key].at >= sample["t"]):
                continue
            used = sample.get("mem_used_mb")
            readings[key] = GpuReading(float(sample["gpu_util"]), float(sample["mem_util"]),
                                       None if used is None else float(used), float(sample["t"]),
                                       bool(sample.get("emulated", False)), run.job_id)
    return GpuUtilization(readings, problems)
