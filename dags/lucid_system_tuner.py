"""Lucid System Tuner: replay recent history in the simulator over a grid of knobs, one mapped task each.

Weekly, and on demand from the trigger form. Each configuration is its own mapped task instance,
so a Celery or Kubernetes executor spreads the sweep over workers. The report (table + plots) is
kept under LUCID_HOME/reports/tuner/<run id> and shown by the Lucid plugin at /lucid/tuner.
The apply step writes the best configuration only when the `apply` parameter is on.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Asset, Param, dag, task

#: updated each time a sweep's report is written (visible under Assets in the UI)
TUNER_REPORT = Asset(name="lucid_tuner_report")

OBJECTIVES = ["avg_jct", "avg_queue_delay", "p999_queue_delay", "utilization"]


def _numbers(default: list, description: str, **items) -> Param:
    return Param(default, type="array", items={"type": "number", **items}, description=description)


@dag(
    dag_id="lucid_system_tuner",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lucid"],
    doc_md=__doc__,
    params={
        "trace_path": Param("", type="string", description="Trace file to replay; empty: finished jobs of the "
                            "Lucid store (connection lucid_db) from the last `window_days`."),
        "trace_format": Param("auto", enum=["auto", "philly", "helios", "generic"]),
        "window_start": Param("", type="string", description="Trace window start (YYYY-MM-DD), file only"),
        "window_end": Param("", type="string", description="Trace window end, exclusive (YYYY-MM-DD), file only"),
        "window_days": Param(7, type="integer", minimum=1, maximum=3650, description="Store history to replay"),
        "main_nodes": Param(8, type="integer", minimum=1, maximum=10000, description="8-GPU nodes simulated"),
        "tprof_s": _numbers([100, 200, 300], "Tprof: profiling window (s)", minimum=1),
        "nprof_gpus": _numbers([8], "Nprof: widest job profiled on the pool (GPUs)", minimum=0),
        "cprof_nodes": _numbers([2], "Cprof: profiling pool nodes", minimum=0),
        "tiny_threshold": _numbers([0.95], "Tiny threshold (mean co-located speed)", minimum=0, maximum=1),
        "medium_threshold": _numbers([0.85], "Medium threshold", minimum=0, maximum=1),
        "sharing": Param(["auto", "off"], type="array", items={"type": "string", "enum": ["auto", "on", "off"]},
                         description="GPU sharing on/off/auto"),
        "update_cadence": Param(["daily"], type="array",
                                items={"type": "string", "enum": ["daily", "weekly", "never"]},
                                description="How often the duration model refreshes"),
        "aging": _numbers([32], "Priority aging: GPU-seconds of priority a queued job gains per second", minimum=0),
        "objective": Param("avg_jct", enum=OBJECTIVES,
                           description="What the ranking minimizes (utilization: maximizes)"),
        "max_configurations": Param(64, type="integer", minimum=1, maximum=4096),
        "apply": Param(False, type="boolean", description="Write the best configuration to the live config file"),
    },
)
def lucid_system_tuner():
    @task
    def expand_grid(params=None) -> list[dict]:
        """One item per configuration of the grid (the unit each mapped task simulates)."""
        from lucid_core.tuner import GRID_KNOBS, expand_grid

        grid = {name: params[name] for name in GRID_KNOBS}
        configs = expand_grid(grid)
        if not configs:
            raise ValueError("the grid has no valid configuration (is a Medium threshold above every Tiny one?)")
        if len(configs) > params["max_configurations"]:
            raise ValueError(f"{len(configs)} configurations exceed max_configurations={params['max_configurations']}")
        return [{"index": i, "overrides": overrides} for i, overrides in enumerate(configs)]

    @task(map_index_template="{{ lucid_config_label }}")
    def simulate_configuration(item: dict, params=None) -> dict:
        """Replay the trace window under one configuration."""
        import os
        import socket

        from airflow.sdk import get_current_context
        from lucid_airflow.tuning import load_tuner_trace

        get_current_context()["lucid_config_label"] = f"#{item['index']} " + ", ".join(
            f"{k.split('.')[-1]}={v}" for k, v in item["overrides"].items())
        from lucid_core.tuner import TunerSettings, run_configuration

        records = load_tuner_trace(params)
        settings = TunerSettings(main_nodes=params["main_nodes"], objective=params["objective"])
        result = run_configuration(records, item["overrides"], settings, index=item["index"])
        result.worker = os.environ.get("LUCID_WORKER_NAME") or socket.gethostname()
        return result.to_dict()

    @task(outlets=[TUNER_REPORT])
    def write_report(results: list[dict], params=None, run_id=None) -> dict:
        """Rank the configurations and keep the report where the plugin shows it."""
        from lucid_airflow.tuning import report_directory

        from lucid_core.tuner import ConfigResult, TunerSettings, write_report

        settings = TunerSettings(main_nodes=params["main_nodes"], objective=params["objective"])
        summary = write_report([ConfigResult.from_dict(r) for r in results], settings, report_directory(run_id),
                               context={"run_id": run_id, "params": dict(params)})
        return {k: summary[k] for k in ("objective", "configurations", "failed", "best", "workers", "directory")}

    @task
    def apply_best(summary: dict, params=None) -> str:
        """Write the best configuration to the live config file, only when asked to."""
        from airflow.sdk.exceptions import AirflowSkipException

        if not params["apply"]:
            raise AirflowSkipException("apply is off: the report proposes, nothing was changed")
        from lucid_airflow.tuning import live_config_path

        from lucid_core.tuner import chosen_overrides, write_config_toml

        return str(write_config_toml(chosen_overrides(summary), live_config_path()))

    items = expand_grid()
    results = simulate_configuration.expand(item=items)
    apply_best(write_report(results))


lucid_system_tuner()
