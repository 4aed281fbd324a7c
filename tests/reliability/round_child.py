"""Run one scheduling round in this process and SIGKILL it at a named step (a real process death).

    python round_child.py STORE_URL STEP

Steps: the round's own boundaries (after_repair, after_reconcile, after_record, after_launch,
after_execute) and two inside steps: during_decide (the policy has decided, nothing is written)
and during_record (decisions are being written, the transaction is not committed). Exits 0 when
the round never reached STEP.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from runtime_helpers import fast_config

from lucid_core.runtime.local_executor import local_executor
from lucid_core.runtime.round import RoundSettings, SchedulingRound
from lucid_core.runtime.store import Store


def die() -> None:
    sys.stderr.write("KILLED\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


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
    KilledRound(store, local_executor(), fast_config(), settings).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
