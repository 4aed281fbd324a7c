"""Lucid scheduling round: reconcile with the GPU hosts -> profile, bind & place (decide) -> carry out.

One run per minute, never two at once (max_active_runs=1, no catchup), so rounds cannot pile up;
the store's lease also keeps a round started elsewhere (CLI, another scheduler) from deciding at
the same time. The state store is the `lucid_db` connection; GPU hosts are SSH connections named in
the store (keys stay in the secrets backend). Every decision is written before it is carried out,
so a round killed between steps is repaired by the next round's reconcile.

Each task's execution_timeout, and the run's, come from the host call deadline (runtime.host_call_deadline_s,
`lucid_core.runtime.round.deadlines`), which also sets the least lease TTL: a task's host calls fan out to
all hosts at once, each host's batch is given up past its deadline, so a task's time is bounded and the
lease it renews before every fan-out cannot lapse while it works.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from airflow.sdk import dag, task

from lucid_core.config import ConfigError, load_config, load_live_config
from lucid_core.runtime.round.deadlines import RoundDeadlines

# "@continuous" runs rounds back to back (the embedded demo); the default is one round a minute.
ROUND_SCHEDULE = os.environ.get("LUCID_ROUND_SCHEDULE") or timedelta(minutes=1)


def _deadlines() -> RoundDeadlines:
    """The round's time limits from the config its tasks run with (`load_live_config`: LUCID_CONFIG, else
    LUCID_HOME/lucid.toml, the file the tuner applies to); defaults when it cannot be read, said in the parse log
    (the round's own tasks then fail saying why)."""
    try:
        config = load_live_config()
    except ConfigError as exc:
        logging.getLogger(__name__).warning("lucid_scheduling_round: default time limits: %s", exc)
        config = load_config(None, env={})
    return RoundDeadlines.from_runtime(config.runtime)


DEADLINES = _deadlines()


def _timeout(step: str) -> timedelta:
    return timedelta(seconds=DEADLINES.step_timeout_s(step))


@dag(
    dag_id="lucid_scheduling_round",
    schedule=ROUND_SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(seconds=DEADLINES.round_timeout_s + 60),
    default_args={"retries": 0},
    tags=["lucid"],
    doc_md=__doc__,
)
def lucid_scheduling_round():
    @task(execution_timeout=_timeout("reconcile"))
    def reconcile() -> dict:
        """Poll the hosts: what runs, what ended (exit codes), which profiling windows are over."""
        from lucid_airflow.connections import store_url
        from lucid_airflow.round_steps import reconcile

        return reconcile(store_url())

    @task(execution_timeout=_timeout("decide"))
    def profile_bind_and_place(reconciled: dict) -> dict:
        """The policy decides: profiling windows (space-aware profiler), sharing mode and affine pairs
        (binder), priority order and compact placement (orchestrator); each decision recorded with its reason."""
        from lucid_airflow.connections import store_url
        from lucid_airflow.round_steps import profile_bind_and_place

        return profile_bind_and_place(store_url(), reconciled)

    @task(execution_timeout=_timeout("carry_out"))
    def carry_out(decided: dict) -> dict:
        """Launch and stop on the GPU hosts what was recorded; release the round lease."""
        from lucid_airflow.connections import store_url
        from lucid_airflow.round_steps import carry_out

        return carry_out(store_url(), decided)

    carry_out(profile_bind_and_place(reconcile()))


lucid_scheduling_round()
