"""A round's host calls fanned out to hosts at once: a bounded pool, one batch per host, a deadline per call.

The round hands over, per host, the calls it wants made there (in order). The pool runs each host's
batch in one worker, so a host sees its calls in order over its one connection, at most `workers`
hosts at a time, and returns each call's value or error. A host that does not answer within a call's
deadline (`HostUnreachable`) is given up for the rest of the round: its remaining calls are not tried
and later batches for it fail at once, so a silent host costs the round one deadline. A batch still
running past the sum of its calls' deadlines (plus a grace) is given up the same way, without waiting
for its worker. Nothing here touches the store: the round applies the results in its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

from lucid_core.runtime.hosts.executor import HostUnreachable

T = TypeVar("T")
GRACE_S = 2.0  # a batch's worker may overrun its calls' deadlines this long before the pool gives it up


@dataclass(frozen=True)
class HostCall(Generic[T]):
    """One call to make on a host, and how long it may take (the executor enforces it; the pool backs it up)."""

    run: Callable[[], T]
    deadline_s: float


@dataclass(frozen=True)
class CallResult(Generic[T]):
    """What one call returned, or the error it raised (HostUnreachable when the host was given up)."""

    value: T | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class HostCallPool:
    """Runs per-host batches of calls concurrently (at most `workers` hosts at once); counts the calls made.

    `give_up(host)` is told when a batch overran its deadlines, so the executor can drop that host's
    connection (which also ends the stuck worker's wait).
    """

    def __init__(self, workers: int, give_up: Callable[[str], None] | None = None) -> None:
        self.workers = max(1, int(workers))
        self.give_up = give_up
        self.down: dict[str, HostUnreachable] = {}  # hosts given up this round, and why
        self.calls = 0  # calls started on hosts
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="lucid-host")

    def run(self, batches: Mapping[str, Sequence[HostCall[T]]], limit_s: float | None = None,
            tick: Callable[[], None] | None = None) -> dict[str, list[CallResult[T]]]:
        """Each host's calls in order, hosts concurrently; one result per call, per host. A host's batch is
        given up past the sum of its calls' deadlines, or past `limit_s` when that is shorter. `tick` runs in
        the caller's thread at least every half second while calls are in flight (the round keeps its lease)."""
        results: dict[str, list[CallResult[T]]] = {}
        started: dict[str, float] = {}
        futures: dict[Future[list[CallResult[T]]], str] = {}
        for host, calls in batches.items():
            if not calls:
                results[host] = []
            elif host in self.down:
                results[host] = [CallResult(error=self.down[host]) for _ in calls]
            else:
                futures[self._pool.submit(self._run_batch, host, list(calls), started)] = host
        budgets = {host: min(sum(c.deadline_s for c in batches[host]), limit_s or float("inf")) + GRACE_S
                   for host in futures.values()}
        pending = set(futures)
        while pending:
            now = time.monotonic()
            ends = [started[futures[f]] + budgets[futures[f]] for f in pending if futures[f] in started]
            timeout = max(0.0, min(ends) - now) if ends else 0.5
            done, pending = wait(pending, timeout=min(timeout, 0.5), return_when=FIRST_COMPLETED)
            if tick is not None and pending:
                tick()
            for future in done:
                results[futures[future]] = future.result()  # a BaseException in a worker (a crash) surfaces here
            now = time.monotonic()
            for future in [f for f in pending if futures[f] in started
                           and now > started[futures[f]] + budgets[futures[f]]]:
                pending.discard(future)
                host = futures[future]
                results[host] = self._overran(host, len(batches[host]), budgets[host])
        return {host: results[host] for host in batches}

    def _run_batch(self, host: str, calls: list[HostCall[T]], started: dict[str, float]) -> list[CallResult[T]]:
        """One host's calls in order; a HostUnreachable ends the batch (the rest fail with it, untried)."""
        started[host] = time.monotonic()
        out: list[CallResult[T]] = []
        for call in calls:
            if host in self.down:
                out.append(CallResult(error=self.down[host]))
                continue
            with self._lock:
                self.calls += 1
            try:
                out.append(CallResult(value=call.run()))
            except HostUnreachable as exc:
                self.down.setdefault(host, exc)
                out.append(CallResult(error=exc))
            except Exception as exc:  # the host answered with an error: this call's alone
                out.append(CallResult(error=exc))
        return out

    def _overran(self, host: str, count: int, budget_s: float) -> list[CallResult[T]]:
        """A batch that ran past its calls' deadlines: give the host up for the round (its worker is left)."""
        exc = HostUnreachable(f"host {host}: no answer within {budget_s:.1f} s (its calls' deadlines)")
        self.down.setdefault(host, exc)
        if self.give_up is not None:
            self.give_up(host)
        # its own error, which says the calls may have reached the host: the worker, still running, may have put
        # one of its later calls' errors in `down` (one that never reached it) after earlier calls did
        return [CallResult(error=exc) for _ in range(count)]

    def close(self) -> None:
        """Stop taking batches; workers still stuck on a given-up host are left to end on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
