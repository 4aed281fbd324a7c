"""Run `lucid round` in this process, stalled inside its first launch: after the lease was renewed for
it, before the command reaches the host (a paused VM, a slow SSH connect).

    python stall_launch_child.py STORE_URL GO_FILE

Prints STALLED on stderr when the stall begins, waits until GO_FILE exists (at most 90 s), then lets
the launch go on and prints the round's report as JSON.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from lucid_core.runtime.hosts.executor import HostExecutor


def stall_first_launch(go: Path) -> None:
    original = HostExecutor.launch
    stalled: list[bool] = []

    def launch(self, host, spec):
        if not stalled:
            stalled.append(True)
            sys.stderr.write(f"STALLED {spec.run_id}\n")
            sys.stderr.flush()
            deadline = time.monotonic() + 90
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return original(self, host, spec)

    HostExecutor.launch = launch  # type: ignore[method-assign]


def main() -> None:
    url, go = sys.argv[1], Path(sys.argv[2])
    stall_first_launch(go)
    from lucid_core.cli import main as lucid

    sys.exit(lucid(["round", "--store", url, "--json", "--lucid-config", os.environ["LUCID_CONFIG"]]))


if __name__ == "__main__":
    main()
