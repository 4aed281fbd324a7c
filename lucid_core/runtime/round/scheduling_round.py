"""One scheduling round: carry out what is pending -> reconcile with the hosts -> decide -> execute.

Decisions (and the runs they plan) are committed before anything is carried out. Execution
works off the store's rows, not off memory: a planned run is launched (idempotently: the
host-side run directory is the marker) and a run with a stop reason is stopped. So a round
that dies between any two steps leaves rows the next round finishes, and nothing runs twice.
A lease row keeps two rounds from deciding at once.

The steps live in modules of this room named for what they do (launching, settling, profiles, decisions,
inventory_steps, pruning, on base); this module composes them.
"""

from __future__ import annotations

import time

from lucid_core.runtime.round.base import collector_paused
from lucid_core.runtime.round.decisions import DecisionSteps
from lucid_core.runtime.round.inventory_steps import HostInventorySteps
from lucid_core.runtime.round.launching import LaunchSteps
from lucid_core.runtime.round.profiles import ProfileSteps
from lucid_core.runtime.round.pruning import PruneSteps
from lucid_core.runtime.round.settings import (  # noqa: F401 - the round's public names
    InjectedCrash,
    RoundReport,
    RoundSettings,
    default_holder,
    emulated_profile_from_catalog,
)
from lucid_core.runtime.round.settling import SettlingSteps
from lucid_core.runtime.store import lease


class SchedulingRound(LaunchSteps, SettlingSteps, ProfileSteps, DecisionSteps, HostInventorySteps, PruneSteps):
    """Runs one round against a store and hosts. Build one per round (it holds no state between)."""

    # ------------------------------------------------------------------------------ driver
    def run(self) -> RoundReport:
        started = time.perf_counter()
        self.now = self.clock()
        if not self.take_lease():
            self.report.acquired = False
            return self.report
        try:
            with collector_paused():  # a round's garbage is acyclic; the process collects after it
                self.open_round()
                self.load_hosts()
                self.repair()
                self._crash("after_repair")
                self.observe()
                self._crash("after_reconcile")
                self.decide()
                self._crash("after_record")
                self.execute()
        except lease.Fenced as exc:
            self.stop_fenced(exc)
            self._finish_round(started)
            return self.report
        except Exception as exc:
            self.report.errors.append(f"{type(exc).__name__}: {exc}")
            self._finish_round(started)
            self.give_back_lease()
            raise
        finally:
            self.close()
        self._finish_round(started)
        self.give_back_lease()
        return self.report

    # ------------------------------------------------------------------------------ the steps
    # (`lucid round` runs them all in `run`; the round DAG's tasks run them one task each)
    def repair(self) -> None:
        """Finish what an earlier round left: runs on removed hosts, planned launches, pending stops."""
        self.repair_unknown_hosts()
        self.carry_out_pending()

    def observe(self) -> None:
        """Read every host's runs and settle their ends; give up on hosts silent too long."""
        self.reconcile()
        self.give_up_lost_hosts()

    def execute(self) -> None:
        """Carry out what `decide` recorded (launches, stops), then delete drained hosts once empty and remove
        the files of runs long over from their hosts."""
        self.carry_out_pending()
        self._crash("after_execute")
        self.remove_drained_hosts()
        self.prune_ended_runs()
