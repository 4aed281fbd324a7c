"""Run one scheduling round in this process and SIGKILL it at a named step (a real process death).

    python round_child.py STORE_URL STEP

Steps: the round's own boundaries (after_repair, after_reconcile, after_record, after_launch,
after_execute) and three inside steps: during_decide (the policy has decided, nothing is written),
during_record (decisions are being written, the transaction is not committed) and during_calls (a
host call has returned while another host's call is still in flight: the round dies mid fan-out,
before it applies what the hosts answered). Exits 0 when the round never reached STEP.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from runtime_helpers import fast_config

from lucid_core.runtime.hosts.executor import HostExecutor
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.store.store import Store


def die() -> None:
    sys.stderr.write("KILLED\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class DyingExecutor(HostExecutor):
    """Dies (SIGKILL) when a host call has returned while another host's call is in flight: each call, once
    answered, waits up to 0.5 s for a call to another host to be under way, then kills the process."""

    def __init__(self, inner: HostExecutor) -> None:
        super().__init__(inner.transports, timeout_s=inner.timeout_s)
        self._lock = threading.Lock()
        self._in_flight = 0

    def _run(self, host, script, timeout_s=None):
        with self._lock:
            self._in_flight += 1
        try:
            result = super()._run(host, script, timeout_s)
            until = time.monotonic() + 0.5
            while time.monotonic() < until:
                with self._lock:
                    if self._in_flight > 1:
                        die()
                time.sleep(0.01)
        finally:
            with self._lock:
                self._in_flight -= 1
        return result


class KilledRound(SchedulingRound):
    """A round that dies by SIGKILL at `kill_at` (no finally blocks, no rollback, no lease release)."""

    kill_at = ""

    def _crash(self, step: str) -> None:
        if step == self.kill_at:
            die()

    def _record(self, s, decision, *args):
        result = super()._record(s, decision, *args)
        if self.kill_at == "during_record":
            s.flush()  # the rows are in the open transaction, not committed
            die()
        return result

    def decide(self):
        if self.kill_at == "during_decide":
            factory = self.policy_factory

            def dying_factory(config, snapshot):
                policy = factory(config, snapshot)
                schedule = policy.schedule

                def schedule_then_die(view):
                    decisions = schedule(view)
                    if decisions:
                        die()
                    return decisions

                policy.schedule = schedule_then_die
                return policy

            self.policy_factory = dying_factory
        return super().decide()


def main() -> int:
    url, step = sys.argv[1], sys.argv[2]
    store = Store(url)
    settings = RoundSettings(stop_grace_s=1.0, telemetry_interval_s=0.25, launch_grace_s=30, lease_ttl_s=0.5,
                             holder="killed-child")
    KilledRound.kill_at = step
    executor = DyingExecutor(local_executor()) if step == "during_calls" else local_executor()
    KilledRound(store, executor, fast_config(), settings).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
