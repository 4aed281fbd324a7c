"""Run one scheduling round in this process, stalled for a while between its snapshot and its writes.

    python slow_round_child.py STORE_URL GO_FILE cli|dag

`cli`: the round `lucid round` runs (SchedulingRound.run), lease TTL from LUCID_CONFIG. `dag`: the
round DAG's task functions in turn (reconcile, profile_bind_and_place, carry_out). Either way the
round stalls at its `after_snapshot` step (as a slow host read or a paused VM would stall it) until
GO_FILE exists (at most 90 s), then goes on and prints its report as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lucid_core.runtime.round.scheduling_round import SchedulingRound

REPO = Path(__file__).resolve().parents[2]


def stall_after_snapshot(go: Path) -> None:
    original = SchedulingRound._crash

    def stalled(self: SchedulingRound, step: str) -> None:
        if step == "after_snapshot":
            sys.stderr.write("STALLED\n")
            sys.stderr.flush()
            deadline = time.monotonic() + 90
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        original(self, step)

    SchedulingRound._crash = stalled  # type: ignore[method-assign]


def main() -> None:
    url, go, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    stall_after_snapshot(go)
    if mode == "cli":
        from lucid_core.cli import main as lucid

        sys.exit(lucid(["round", "--store", url, "--json", "--config", os.environ["LUCID_CONFIG"]]))
    sys.path.insert(0, str(REPO / "plugins"))
    from lucid_airflow import round_steps

    reconciled = round_steps.reconcile(url)
    decided = round_steps.profile_bind_and_place(url, reconciled)
    carried = round_steps.carry_out(url, decided)
    print(json.dumps({"reconcile": reconciled, "decide": decided, "carry_out": carried}, default=str))


if __name__ == "__main__":
    main()
