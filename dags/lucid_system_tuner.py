"""Lucid System Tuner: replay recent history in the simulator over a grid of knobs, one mapped task each.

Weekly (Mondays 03:00 UTC, never on unpausing: see SCHEDULE), and on demand from the trigger form:
one press of Trigger is one run. Its defaults replay the store's finished jobs on the live inventory
(the hosts, GPUs per host, VCs and profiling pool of `lucid hosts list`). Each
configuration is its own mapped task instance, so a Celery or Kubernetes executor spreads the sweep
over workers; the current configuration is replayed too, under several workload draws, to measure
the run-to-run noise. The grid is built around the live configuration: a knob's field left empty keeps
its current value, or, when the knob is listed in `around`, takes a smaller, the current and a larger
value. The report (verdict, table with the current row first, plots) is kept under
LUCID_HOME/reports/tuner/<run id> and shown by the Lucid plugin at /lucid/tuner. It says "keep the
current configuration" when no configuration beats it by more than that noise. The apply step
writes the best configuration only when the `apply` parameter is on and the report proposes a change.
A run whose store window holds no finished job (a quiet week) is skipped by its first task, with the reason.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Asset, CronTriggerTimetable, Param, dag, task

#: updated each time a sweep's report is written (visible under Assets in the UI)
TUNER_REPORT = Asset(name="lucid_tuner_report")

OBJECTIVES = ["avg_jct", "avg_queue_delay", "p999_queue_delay", "utilization"]

WINDOW_DAYS = 7  # days of store history a run without a trace file replays (the form's default)
#: The form names of the knobs a sweep can vary (lucid_core.tuner_grid.GRID_KNOBS; not imported at parse time).
KNOBS = ["tprof_s", "nprof_gpus", "cprof_nodes", "tiny_threshold", "medium_threshold", "sharing", "update_cadence",
         "pair_priority_ratio", "aging", "guard_slowdown", "backfill_margin", "long_quantile", "guard_tail",
         "yield_margin", "yield_max"]

#: Mondays 03:00 UTC. A cron trigger timetable with no start_date and run_immediately=timedelta(0): on
#: the first unpause the scheduler waits for the next Monday instead of creating a run for the last one.
#: In Airflow 3.3, with catchup=False and a start_date the scheduler runs the most recent past tick at once
#: (so unpausing and pressing Trigger made two runs), and run_immediately=False still does so within a
#: tenth of the interval after a tick; timedelta(0) never does.
SCHEDULE = CronTriggerTimetable("0 3 * * 1", timezone="UTC", run_immediately=timedelta(0))

_EMPTY = "A JSON list of values; empty: the current value (or values around it when listed in `around`)."


def _numbers(description: str, **items) -> Param:
    """An optional list of numbers for one knob (null or empty: the knob is not given values)."""
    return Param(None, type=["null", "array"], items={"type": "number", **items},
                 description=f"{description}. {_EMPTY}")


def _choices(description: str, choices: list[str]) -> Param:
    """An optional list of choices for one text knob."""
    return Param(None, type=["null", "array"], items={"type": "string", "enum": choices},
                 description=f"{description}. {_EMPTY}")


@dag(
    dag_id="lucid_system_tuner",
    schedule=SCHEDULE,
    catchup=False,
    max_active_runs=1,
    tags=["lucid"],
    doc_md=__doc__,
    params={
        # optional fields admit null (Airflow's trigger form requires a typed field that does not)
        "trace_path": Param(None, type=["null", "string"], description="Trace file to replay, inside "
                            "LUCID_TRACES_DIR (default LUCID_HOME/traces); empty: finished jobs of the Lucid store "
                            "(connection lucid_db) from the last `window_days`."),
        "trace_format": Param("auto", enum=["auto", "philly", "helios", "generic"]),
        "window_start": Param(None, type=["null", "string"], description="Trace window start (YYYY-MM-DD), "
                              "file only; empty: the file's first job"),
        "window_end": Param(None, type=["null", "string"], description="Trace window end, exclusive (YYYY-MM-DD), "
                            "file only; empty: the file's last job"),
        "window_days": Param(WINDOW_DAYS, type="integer", minimum=1, maximum=3650,
                             description="Store history to replay"),
        "main_nodes": Param(None, type=["null", "integer"], minimum=1, maximum=10000,
                            description="Empty: simulate the live inventory (hosts, GPUs per host, VCs, profiling "
                                        "pool). A number: that many 8-GPU nodes instead (profiling pool carved out)."),
        "around": Param(["tprof_s", "sharing"], type="array", items={"type": "string", "enum": KNOBS},
                        description="Knobs swept around their current value (a smaller, the current and a larger "
                                    "one; every choice of a text knob) when their own field below is empty"),
        "tprof_s": _numbers("Tprof: profiling window (s)", minimum=1),
        "nprof_gpus": _numbers("Nprof: widest job profiled on the pool (GPUs)", minimum=0),
        "cprof_nodes": _numbers("Cprof: profiling pool nodes", minimum=0),
        "tiny_threshold": _numbers("Tiny threshold (mean co-located speed)", minimum=0, maximum=1),
        "medium_threshold": _numbers("Medium threshold", minimum=0, maximum=1),
        "sharing": _choices("GPU sharing on/off/auto", ["auto", "on", "off"]),
        "pair_priority_ratio": _numbers("Sharing: never pair a job with a partner this many times shorter "
                                        "(predicted GPU-time)", minimum=1),
        "update_cadence": _choices("How often the duration model refreshes", ["daily", "weekly", "never"]),
        "aging": _numbers("Priority aging: GPU-seconds of priority a queued job gains per second", minimum=0),
        "guard_slowdown": _numbers("Starvation guard: a job waiting this many times its predicted run time "
                                   "goes first with a node reservation (0: off)", minimum=0),
        "backfill_margin": _numbers("EASY backfilling: a job may use nodes reserved for an overdue job if it would "
                                    "end before that job starts even at this many times its predicted run time",
                                    minimum=1),
        "long_quantile": _numbers("Jobs above this quantile of predicted GPU-time run in arrival order, "
                                  "the oldest taking GPUs from younger ones (1: off)", minimum=0, maximum=1),
        "guard_tail": _numbers("Tail guard: a job waiting this many times the recent P99 queueing goes "
                               "first with a node reservation (0: off)", minimum=0),
        "yield_margin": _numbers("Yielding: a waiting job takes GPUs from preemptible jobs with more than this "
                                 "many times its predicted GPU-time left (0: never stop a job)", minimum=0),
        "yield_max": _numbers("Yielding: times one job may be stopped", minimum=0),
        "objective": Param("avg_jct", enum=OBJECTIVES,
                           description="What the ranking minimizes (utilization: maximizes)"),
        "max_configurations": Param(64, type="integer", minimum=1, maximum=4096),
        "apply": Param(False, type="boolean", description="Write the best configuration to the live config file"),
    },
)
def lucid_system_tuner():
    @task
    def expand_grid(params=None, dag_run=None, dag=None) -> list[dict]:
        """One item per configuration of the grid (the unit each mapped task simulates); the run's inputs are
        checked first, so a typo or a file it may not read fails before any simulating, and a store window with
        no finished job (a quiet week) skips the run, saying so, instead of failing every mapped task."""
        from airflow.sdk.exceptions import AirflowSkipException
        from lucid_airflow.run_inputs import (
            checked_trace_path,
            refuse_unknown_conf,
            refuse_unreadable_window,
            refuse_window_without_trace,
        )
        from lucid_airflow.tuning import NothingToReplay, current_config, load_tuner_trace, tuner_fleet, tuner_window

        from lucid_core.tuner import GRID_KNOBS, sweep_grid_with_configurations, sweep_items

        conf = getattr(dag_run, "conf", None)
        refuse_unknown_conf(conf, dag.params.keys())  # params: conf merged in
        refuse_window_without_trace(params, conf, {"window_days": WINDOW_DAYS})
        if params.get("trace_path"):
            checked_trace_path(params["trace_path"])
            refuse_unreadable_window(params)
        configs = sweep_grid_with_configurations({name: params.get(name) for name in GRID_KNOBS},
                                                 params.get("around") or [], current_config(),
                                                 most=params["max_configurations"]).configs
        if len(configs) > params["max_configurations"]:
            raise ValueError(f"{len(configs)} configurations exceed max_configurations={params['max_configurations']}")
        window = tuner_window(params)  # one snapshot of the store's window for every mapped task
        try:  # read once here, after the grid's checks: a wrong trace_format or an empty window fails no mapped task
            load_tuner_trace(params, window)
        except NothingToReplay as exc:  # a quiet week: nothing to tune on is no failure
            raise AirflowSkipException(str(exc)) from None
        fleet = tuner_fleet(params)  # one snapshot of the inventory for every mapped task
        return [{**item, "fleet": fleet, "window": window} for item in sweep_items(configs)]

    @task(map_index_template="{{ lucid_config_label }}")
    def simulate_configuration(item: dict, params=None) -> dict:
        """Replay the trace window under one configuration."""
        import os
        import socket

        from airflow.sdk import get_current_context
        from lucid_airflow.tuning import current_config, load_tuner_trace, tuner_settings

        from lucid_core.tuner import item_label, run_configuration

        role = item.get("role", "candidate")
        get_current_context()["lucid_config_label"] = item_label(item)

        records = load_tuner_trace(params, item.get("window"))
        settings = tuner_settings(params, item.get("fleet"))
        result = run_configuration(records, item["overrides"], settings, index=item["index"], base=current_config(),
                                   seed=item.get("seed"), role=role)
        result.worker = os.environ.get("LUCID_WORKER_NAME") or socket.gethostname()
        return result.to_dict()

    @task(outlets=[TUNER_REPORT])
    def write_report(items: list[dict], results: list[dict], params=None, run_id=None) -> dict:
        """Rank the configurations against the current one and keep the report where the plugin shows it."""
        from lucid_airflow.tuning import current_config, report_directory, tuner_settings

        from lucid_core.tuner import GRID_KNOBS, ConfigResult, sweep_grid, write_report

        settings = tuner_settings(params, items[0].get("fleet") if items else None)
        base = current_config()
        # the grid again (deterministic): the report says how many combinations conflicting knobs left out
        grid = sweep_grid({name: params.get(name) for name in GRID_KNOBS}, params.get("around") or [], base)
        summary = write_report([ConfigResult.from_dict(r) for r in results], settings, report_directory(run_id),
                               context={"run_id": run_id, "params": dict(params)}, base=base, grid=grid)
        return {k: summary[k] for k in ("objective", "configurations", "failed", "best", "keep_current", "verdict",
                                        "cluster", "workers", "directory")}

    @task
    def apply_best(summary: dict, params=None) -> str:
        """Write the best configuration to the live config file, only when asked to."""
        from airflow.sdk.exceptions import AirflowSkipException
        from lucid_airflow.tuning import record_applied

        if not params["apply"]:
            record_applied(summary["directory"], None, "apply was off: proposed only, nothing was changed")
            raise AirflowSkipException("apply is off: the report proposes, nothing was changed")
        if summary.get("keep_current"):
            record_applied(summary["directory"], None, "nothing to apply: the verdict keeps the current configuration")
            raise AirflowSkipException(f"nothing to apply: {summary.get('verdict')}")
        from lucid_core.config import live_config_path
        from lucid_core.tuner import chosen_overrides, write_config_toml

        written = str(write_config_toml(chosen_overrides(summary), live_config_path()))
        record_applied(summary["directory"], written, f"written to {written}")
        return written

    items = expand_grid()
    results = simulate_configuration.expand(item=items)
    apply_best(write_report(items, results))


lucid_system_tuner()
