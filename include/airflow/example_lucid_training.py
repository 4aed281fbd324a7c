"""Example for data-platform teams: prepare data, train on the Lucid GPU fleet, evaluate the result.

Copy this file into your own DAGs folder (it is kept out of this repository's dags/ so that the
scheduler's Airflow does not load it), put this repository's plugins/ folder on your Airflow's
plugins path (or on PYTHONPATH), and give your Airflow the `lucid_db` connection. `train` submits
the job with an idempotency key per task try, defers to the triggerer while the job queues and
runs, and fails with the job's exit code and end reason if it does not complete.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from airflow.sdk import Param, dag, get_current_context, task
from lucid_airflow.operators import LucidSubmitJobOperator


@dag(
    dag_id="example_lucid_training",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["lucid", "example"],
    params={
        "data_root": Param("/shared/datasets/example", type="string",
                           description="storage the GPU hosts can read; prepare writes the manifest here"),
        "train_script": Param("python train.py", type="string",
                              description="run on the GPU hosts as `<train_script> --manifest <path>`"),
        "vc": Param("default", type="string", description="the virtual cluster to train in"),
        "user": Param("airflow", type="string", description="the job's user (an OS user on run-as hosts)"),
    },
)
def example_lucid_training():
    @task
    def prepare() -> str:
        """Write the manifest of the data to train on where the GPU hosts can read it; its path."""
        params = get_current_context()["params"]
        root = Path(params["data_root"])
        root.mkdir(parents=True, exist_ok=True)
        manifest = root / "manifest.json"
        manifest.write_text(json.dumps({"shards": ["part-0000.parquet"], "rows": 0}))
        return str(manifest)

    train = LucidSubmitJobOperator(
        task_id="train",
        command="{{ params.train_script }} --manifest {{ ti.xcom_pull(task_ids='prepare') }}",
        gpus=1,
        vc="{{ params.vc }}",
        user="{{ params.user }}",
        name="example-{{ run_id }}",
        env={"DATA_MANIFEST": "{{ ti.xcom_pull(task_ids='prepare') }}"},
        deferrable=True,
        poll_interval=5,
    )

    @task
    def evaluate(job_id: str) -> dict:
        """Look at how the training job went (a real pipeline would load the model it wrote and score it)."""
        from lucid_airflow.hooks import LucidHook

        hook = LucidHook()
        try:
            info = hook.get_job(job_id)
        finally:
            hook.close()
        runtime_s = (info["end_time"] - info["start_time"]) if info["start_time"] and info["end_time"] else None
        return {"job_id": job_id, "state": info["state"], "runtime_s": runtime_s,
                "ended_in_profiling": bool(info["ended_in_profiling"])}

    prepare() >> train
    evaluate(train.output)


example_lucid_training()
