"""Operators for a user's own pipeline: submit a training job to Lucid, wait for it, watch one submitted elsewhere."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator, BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from lucid_airflow.connections import STORE_CONN_ID
from lucid_airflow.hooks import TASK_CANCEL_NOTE, LucidHook, LucidJobTimeout, is_terminal
from lucid_airflow.triggers import LucidJobTrigger, job_outcome
from lucid_core.domain import JobState

XCOM_JOB_ID = "job_id"


def _digest(parts: list[Any]) -> str:
    """32 hex digits of the JSON of `parts` (JSON-quoted: ids with separators in them cannot collide)."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def task_lineage(dag_id: str, task_id: str, run_id: str, map_index: int, run_started: str,
                 clear_number: int, first_try: int = 1) -> str:
    """The key prefix every try of one task instance in one DAG run shares (what a retry looks for).

    A run deleted and made again keeps its run_id (a re-run of a scheduled date) but starts anew, and a
    cleared task starts its tries again from a later `first_try` (its run also counts one more clear, unless
    the clear left the run's state alone): each is a new lineage, whose first try submits its own job."""
    return f"airflow:{_digest([dag_id, task_id, run_id, map_index, run_started, clear_number, first_try])}:"


def task_idempotency_key(lineage: str, try_number: int, ti_id: str) -> str:
    """A submission key unique to one try (at most 128 characters, as the store allows): executing the same try
    again (a worker lost after submitting) finds the job it submitted. `ti_id` is Airflow's id of the try."""
    return f"{lineage}{_digest([try_number, str(ti_id)])}"


def context_lineage(context: Mapping[str, Any]) -> str:
    """The task instance's lineage; one of its own when the DAG run has no start date to tell incarnations by.

    Its first try is Airflow's own reckoning (`max_tries - retries + 1`): a clear sets `max_tries` to the
    try number plus the retries, a retry leaves it."""
    ti, run = context["ti"], context.get("dag_run")
    started = getattr(run, "start_date", None)
    if started is None:
        return task_lineage(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, f"try {ti.id}", 0)
    clears = getattr(run, "clear_number", 0)
    max_tries, retries = getattr(ti, "max_tries", None), getattr(getattr(ti, "task", None), "retries", 0) or 0
    first_try = max_tries - retries + 1 if isinstance(max_tries, int) and isinstance(retries, int) else 1
    return task_lineage(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, started.isoformat(),
                        clears if isinstance(clears, int) else 0, first_try)


ADOPTED_STATES = frozenset(s.value for s in JobState) - {JobState.FAILED.value}


def _seconds(limit: timedelta | float | None) -> float | None:
    """A time limit as the store keeps it: seconds (None: no limit)."""
    return limit.total_seconds() if isinstance(limit, timedelta) else limit


def _rendered_number(value: Any, kind: type) -> Any:
    """A templated number as rendered (`"{{ params.gpus }}"` renders to the text "4"): whole-number text (and,
    for a float, decimal text) as the number, anything else as given for the submission's own check to name."""
    if isinstance(value, str) and value.strip():
        try:
            return kind(value.strip())
        except ValueError:
            return value
    return value


def _rendered_env(env: Any) -> dict[str, str]:
    """`env` as rendered: a mapping (a literal, or an upstream task's output); anything else is refused naming
    what it was, not read as some other mapping."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise AirflowFailException(f"Lucid refused the job: env: expected a mapping of variable names to values, "
                                   f"got {type(env).__name__} {str(env)[:80]!r} (with a template, set the DAG's "
                                   "render_template_as_native_obj=True, or pass an upstream task's output)")
    return dict(env)


class LucidSubmitJobOperator(BaseOperator):
    """Submit a job to the Lucid GPU scheduler and, by default, wait for it to end.

    The job id is pushed to XCom (key `job_id`, and as the return value). The task succeeds when the
    job is COMPLETED and fails with the job's exit code and end reason when it is FAILED (retried as usual)
    or CANCELLED (by a person, outside the task: not retried, which would submit the job again).
    Waiting defers to the triggerer (`deferrable=True`) or polls in the worker. Killing the task
    cancels the job.

    :param command: shell command line (or argv list) run on the GPU hosts; templated
    :param gpus: GPUs the job needs; templated (whole-number text, as a form's value renders, is read as one)
    :param vc: the virtual cluster whose hosts run it; templated; defaults to `default` where the fleet has
        it, else to the fleet's only VC
    :param user: the job's user (the OS user on hosts that run jobs as their submitter); templated;
        defaults to the task's owner
    :param name: a name people read in the queue; templated; defaults to `dag_id.task_id` (`[map index]` added
        for a mapped task)
    :param env: environment variables for the job (a mapping); templated, or an upstream task's output
    :param amp: the job trains with mixed precision (a duration-model feature)
    :param long_cold_start: the job needs long to start (the profiler then watches it longer)
    :param preemptible: the job resumes from its own checkpoints, kept on a path every host sees, so Lucid
        may stop it for a much shorter job and start it again
    :param time_limit: the longest the job may run, all its runs together (a timedelta or seconds); past it
        Lucid stops it and it fails (the task with it). Unlike `execution_timeout`, time spent queued does not
        count; templated (seconds as text)
    :param wait_for_completion: wait for the job to end; otherwise succeed once it is submitted
    :param deferrable: wait in the triggerer rather than holding a worker slot
    :param poll_interval: seconds between status reads while waiting
    :param lucid_conn_id: the connection to the Lucid store
    """

    template_fields: Sequence[str] = ("command", "name", "env", "user", "vc", "gpus", "time_limit")
    template_fields_renderers: ClassVar[dict[str, str]] = {"env": "json"}
    ui_color = "#e8f1fb"

    def __init__(self, *, command: str | Sequence[str], gpus: int | str = 1, vc: str | None = None,
                 user: str | None = None, name: str | None = None, env: Mapping[str, str] | None = None,
                 amp: bool = False, long_cold_start: bool = False, preemptible: bool = False,
                 time_limit: timedelta | float | None = None, wait_for_completion: bool = True,
                 deferrable: bool = True, poll_interval: float = 30.0, lucid_conn_id: str = STORE_CONN_ID,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.gpus = gpus
        self.vc = vc
        self.user = user
        self.name = name
        self.env = env  # as given: a template or an upstream task's output is rendered before `execute`
        self.amp = amp
        self.long_cold_start = long_cold_start
        self.preemptible = preemptible
        self.time_limit = time_limit
        self.wait_for_completion = wait_for_completion
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.lucid_conn_id = lucid_conn_id
        self.job_id: str | None = None

    @cached_property
    def hook(self) -> LucidHook:
        return LucidHook(lucid_conn_id=self.lucid_conn_id)

    def build_request(self, context: Mapping[str, Any]) -> Any:
        """The JobRequest for this try of this task instance, keyed so that a re-run of the try reattaches."""
        from lucid_core.runtime.surfaces.submission import JobRequest

        ti = context["ti"]
        key = task_idempotency_key(context_lineage(context), ti.try_number, str(ti.id))
        mapped = f"[{ti.map_index}]" if isinstance(ti.map_index, int) and ti.map_index >= 0 else ""
        return JobRequest(command=self.command, gpus=_rendered_number(self.gpus, int),
                          user=self.user or self.owner, vc=self.vc or "",
                          name=self.name or f"{ti.dag_id}.{ti.task_id}{mapped}", amp=self.amp,
                          long_cold_start=self.long_cold_start, preemptible=self.preemptible,
                          env=_rendered_env(self.env), time_limit_s=_seconds(_rendered_number(self.time_limit, float)),
                          idempotency_key=key)

    def _default_vc(self) -> str:
        """With no `vc`: `default` where the fleet has it (what this operator always sent), else the fleet's only
        VC; several and none of them `default`: refused naming them."""
        from lucid_core.runtime.surfaces.submission import only_vc, vc_capacity

        store = self.hook.get_conn()
        if "default" in vc_capacity(store):
            return "default"
        try:
            return only_vc(store)
        except ValueError as exc:
            raise AirflowFailException(f"Lucid refused the job: {exc}; give the operator vc=...") from exc

    def execute(self, context: Mapping[str, Any]) -> str:
        try:
            return self._submit_and_wait(context)
        finally:
            self.hook.close()

    def _submit_and_wait(self, context: Mapping[str, Any]) -> str:
        from lucid_core.runtime.surfaces.submission import SubmissionError

        request = self.build_request(context)
        found = self.hook.latest_job_with_key_prefix(request.user, context_lineage(context))
        self.job_id = self._earlier_tries_job(found, request)
        if self.job_id is None:
            if not request.vc:  # chosen only now: a fleet changed since an earlier try must not orphan its job
                same_try = found is not None and found.idempotency_key == request.idempotency_key and found.vc
                request = replace(request, vc=found.vc if same_try else self._default_vc())
            try:
                self.job_id = self.hook.submit_job(request)
            except SubmissionError as exc:  # a bad request stays bad on every retry
                raise AirflowFailException(f"Lucid refused the job: {exc}") from exc
            self.log.info("Lucid job %s submitted (%s GPU(s) in VC %s)", self.job_id, request.gpus, request.vc)
        context["ti"].xcom_push(key=XCOM_JOB_ID, value=self.job_id)
        if not self.wait_for_completion:
            return self.job_id
        info = self.hook.get_job(self.job_id)
        timeout = self.execution_timeout.total_seconds() if isinstance(self.execution_timeout, timedelta) else None
        if not is_terminal(info["state"]) and self.deferrable:
            # the trigger itself ends the wait at the task's timeout, so the job is cancelled, not orphaned
            self.defer(trigger=LucidJobTrigger(job_id=self.job_id, lucid_conn_id=self.lucid_conn_id,
                                               poll_interval=self.poll_interval,
                                               deadline=None if timeout is None else time.time() + timeout),
                       method_name="execute_complete")
        if not is_terminal(info["state"]):
            try:
                info = self.hook.wait_for_job(self.job_id, poll_interval=self.poll_interval, timeout=timeout)
            except LucidJobTimeout as exc:
                self._cancel_after_timeout()
                raise AirflowException(f"{exc}; cancelled it") from exc
        return self._finish(info["job_id"], info["state"], job_outcome(info))

    def _earlier_tries_job(self, found: Any, request: Any) -> str | None:
        """The job an earlier try of this task instance submitted (`found`: the latest keyed with its lineage), when
        this try should wait for it instead of submitting another: it has not ended (the earlier try's worker was
        lost while it ran on), it completed (lost before it could say so), or a person cancelled it. A FAILED job
        is what retries are for, and so is one the task's own timeout or kill cancelled (no person's cancel): None."""
        if found is None or found.state not in ADOPTED_STATES or found.cancel_note == TASK_CANCEL_NOTE:
            return None
        if found.idempotency_key == request.idempotency_key:  # this very try, executed again
            self.log.info("Lucid job %s submitted (%s GPU(s) in VC %s)", found.job_id, request.gpus, found.vc)
        else:
            self.log.info("Lucid job %s, submitted by an earlier try of this task, is %s: waiting for it instead "
                          "of submitting another", found.job_id, found.state)
        return found.job_id

    def execute_complete(self, context: Mapping[str, Any], event: dict[str, Any]) -> str:
        """Resumed from the trigger: succeed on COMPLETED, cancel the job at the task's timeout, else fail
        with the job's reason."""
        self.job_id = event["job_id"]
        if event.get("status") == "timeout":
            try:
                self._cancel_after_timeout()
            finally:
                self.hook.close()
            raise AirflowException(f"{event['message']}; cancelled it")
        return self._finish(event["job_id"], event.get("state"), event["message"])

    def _cancel_after_timeout(self) -> None:
        state = self.hook.cancel_job(self.job_id)
        self.log.info("Timed out: asked Lucid to cancel job %s (was %s)", self.job_id, state)

    def _finish(self, job_id: str, state: str | None, message: str) -> str:
        """Succeed on COMPLETED. A CANCELLED job was cancelled on someone's request (Lucid cancels nothing by
        itself; this task's own cancels at its timeout or kill never get here): fail for good, since a retry
        would submit the job again and take back the GPUs a person just freed. FAILED may be transient: the
        task's retries apply."""
        if state == JobState.CANCELLED.value:
            raise AirflowFailException(f"{message} (cancelled outside this task: not retried)")
        if state != JobState.COMPLETED.value:
            raise AirflowException(f"{message}; its output: lucid logs {job_id} --stderr, or the Lucid job page "
                                   f"/lucid/jobs/{job_id}")
        self.log.info("%s", message)
        return job_id

    def on_kill(self) -> None:
        """The task was killed while waiting in the worker: cancel the job (the next round stops it)."""
        if self.job_id is not None and self.wait_for_completion:
            try:
                state = self.hook.cancel_job(self.job_id)
            finally:
                self.hook.close()
            self.log.info("Asked Lucid to cancel job %s (was %s)", self.job_id, state)


class LucidJobSensor(BaseSensorOperator):
    """Wait for a Lucid job submitted elsewhere (by id) to end: succeed on COMPLETED, fail otherwise.

    :param job_id: the job to watch; templated (e.g. an XCom of an upstream LucidSubmitJobOperator)
    :param deferrable: wait in the triggerer instead of poking from a worker
    """

    template_fields: Sequence[str] = ("job_id",)

    def __init__(self, *, job_id: str, lucid_conn_id: str = STORE_CONN_ID, deferrable: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_id = job_id
        self.lucid_conn_id = lucid_conn_id
        self.deferrable = deferrable

    def execute(self, context: Mapping[str, Any]) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        self.defer(trigger=LucidJobTrigger(job_id=self.job_id, lucid_conn_id=self.lucid_conn_id,
                                           poll_interval=self.poke_interval, cancel_on_kill=False),
                   method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def poke(self, context: Mapping[str, Any]) -> bool:
        hook = LucidHook(lucid_conn_id=self.lucid_conn_id)
        try:
            info = hook.get_job(self.job_id)
        finally:
            hook.close()
        if not is_terminal(info["state"]):
            return False
        if info["state"] != JobState.COMPLETED.value:
            raise AirflowException(job_outcome(info))
        return True

    def execute_complete(self, context: Mapping[str, Any], event: dict[str, Any]) -> None:
        if event.get("state") != JobState.COMPLETED.value:
            raise AirflowException(event["message"])
