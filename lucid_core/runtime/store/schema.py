"""Tables of the live scheduler's state store (SQLAlchemy 2 declarative models).

Times are Unix epoch seconds (floats) so the policy's clock and the store agree.
The Alembic migrations under `migrations/` create exactly these tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    user: Mapped[str] = mapped_column(String(128))
    vc: Mapped[str] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    command: Mapped[str] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    workload: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # a client's key, unique per user (user, idempotency_key): a retried submission returns the same job
    idempotency_key: Mapped[str | None] = mapped_column(String(300), nullable=True)
    amp: Mapped[bool] = mapped_column(Boolean, default=False)
    long_cold_start: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), index=True)
    submit_time: Mapped[float] = mapped_column(Float)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    ended_in_profiling: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # what the scheduler learned
    profiled: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_util: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_util: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_mem_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    profile_emulated: Mapped[bool] = mapped_column(Boolean, default=False)
    share_class: Mapped[int | None] = mapped_column(Integer, nullable=True)
    predicted_duration: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the models (and history) behind share_class and predicted_duration: a round that has the same ones
    # restores a queued job from them instead of classifying and predicting it again
    predicted_by: Mapped[str | None] = mapped_column(String(300), nullable=True)
    known_min_duration: Mapped[float] = mapped_column(Float, default=0.0)
    no_share: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False)  # it resumes from its own checkpoints
    # the longest it may run, all its runs together; past it the round stops it and it fails (None: no limit)
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    yields: Mapped[int] = mapped_column(Integer, default=0)  # times Lucid stopped it for a shorter job
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    pending_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    queue_position: Mapped[int | None] = mapped_column(Integer, nullable=True)

    # ix_jobs_finished: every round reads the latest finished jobs (its history) newest first
    __table_args__ = (UniqueConstraint("user", "idempotency_key", name="uq_jobs_user_idempotency_key"),
                      Index("ix_jobs_finished", "state", "end_time", "start_time", "user", "gpus", "job_id"))


class JobEventRow(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")


class HostRow(Base):
    __tablename__ = "hosts"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    address: Mapped[str] = mapped_column(String(256))
    port: Mapped[int] = mapped_column(Integer, default=22)
    user: Mapped[str] = mapped_column(String(128), default="")
    key_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    vc: Mapped[str] = mapped_column(String(128), default="default")
    pool: Mapped[str] = mapped_column(String(16), default="main")
    executor: Mapped[str] = mapped_column(String(16), default="ssh")  # ssh | local
    telemetry: Mapped[str] = mapped_column(String(16), default="nvml")  # nvml | emulated
    # account: jobs run as the SSH user; submitter: each job as its own user (sudo -n -u USER)
    run_as: Mapped[str] = mapped_column(String(16), default="account", server_default="account")
    # the GPU model packing labels are looked up by (nvidia-smi's name, or declared); None: not known
    gpu_model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # how two jobs share a GPU here: none (never), time-slice (the GPU's default) or mps (a control daemon)
    sharing: Mapped[str] = mapped_column(String(16), default="time-slice", server_default="time-slice")
    workdir: Mapped[str] = mapped_column(Text, default="~/.lucid-runs")
    python: Mapped[str] = mapped_column(String(256), default="python3")
    gpu_memory_mb: Mapped[float] = mapped_column(Float, default=24576.0)
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    # drained to be removed: a round deletes the host once no run of it is planned or running
    remove_when_empty: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    reachable: Mapped[bool] = mapped_column(Boolean, default=True)
    last_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    added_at: Mapped[float] = mapped_column(Float)
    # no new work before this time (the host refused a launch); running jobs are not affected
    cooldown_until: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuRow(Base):
    __tablename__ = "gpus"

    host: Mapped[str] = mapped_column(ForeignKey("hosts.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128), default="")
    memory_mb: Mapped[float] = mapped_column(Float)
    uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)
    declared: Mapped[bool] = mapped_column(Boolean, default=True)


class RunRow(Base):
    """One launch of a job on one host (a profiling window or a main run; wide jobs span hosts)."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_active", "state"), Index("ix_runs_partner", "partner"),
                      Index("ix_runs_unpruned", "pruned_at", "ended_at"))

    run_id: Mapped[str] = mapped_column(String(96), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # profiling | main
    pool: Mapped[str] = mapped_column(String(16))
    gpu_indices: Mapped[list[int]] = mapped_column(JSON)
    node_rank: Mapped[int] = mapped_column(Integer, default=0)
    partner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    profile_in_place: Mapped[bool] = mapped_column(Boolean, default=False)
    profiling_until: Mapped[float | None] = mapped_column(Float, nullable=True)
    # planned -> running -> ended (stop_requested set when the scheduler stops it)
    state: Mapped[str] = mapped_column(String(16))
    stop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    decision_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    planned_at: Mapped[float] = mapped_column(Float)
    # true from planning until a round sends its launch: a first try that reached no session on the host started
    # nothing, so its run ends and the job waits again; false (a later try, or a row an older version wrote) may
    # have started it
    launch_untried: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    outcome: Mapped[str | None] = mapped_column(Text, nullable=True)
    # latest speed estimate while sharing its GPUs (rank-0 main run of a settled pair; None: never measured)
    observed_speed: Mapped[float | None] = mapped_column(Float, nullable=True)
    observed_speed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    observed_speed_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    observed_speed_emulated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # when its status began to read as garbage on its host (None: readable); a round stops it once that has
    # lasted runtime.unreadable_stop_after_s
    unreadable_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    # when the run's files were removed from its host (runtime.keep_ended_runs_days after it ended)
    pruned_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ProfileRow(Base):
    """Summary of a job's profiling window (per-GPU means of its samples)."""

    __tablename__ = "profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    run_id: Mapped[str] = mapped_column(String(96))
    gpu_util: Mapped[float] = mapped_column(Float)
    mem_util: Mapped[float] = mapped_column(Float)
    gpu_mem_mb: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    window_s: Mapped[float] = mapped_column(Float)
    emulated: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[float] = mapped_column(Float)


class ProfileSampleRow(Base):
    __tablename__ = "profile_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    run_id: Mapped[str] = mapped_column(String(96))
    time: Mapped[float] = mapped_column(Float)
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_util: Mapped[float] = mapped_column(Float)
    mem_util: Mapped[float] = mapped_column(Float)
    mem_used_mb: Mapped[float] = mapped_column(Float)
    job_mem_mb: Mapped[float] = mapped_column(Float)  # memory of the job's own processes
    emulated: Mapped[bool] = mapped_column(Boolean)


class DecisionRow(Base):
    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    round_id: Mapped[int] = mapped_column(Integer, index=True)
    time: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), index=True)  # pending | done | skipped | failed
    executed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class RoundRow(Base):
    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    holder: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    decide_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    decisions: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the lease take it wrote under
    fenced: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())  # stopped: lease lost


class LeaseRow(Base):
    """At most one round decides at a time: the holder owns the row until it expires."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)
    # fencing token: grows by one at every take; a holder's writes count only while it is theirs
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class SchedulerStateRow(Base):
    """Policy state that outlives a round (sharing mode, Tprof, borrowed nodes)."""

    __tablename__ = "scheduler_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)


class ModelVersionRow(Base):
    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # duration | throughput_forecaster | packing:<gpu model slug>:<sharing mechanism> (one per key)
    kind: Mapped[str] = mapped_column(String(160), index=True)
    version: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    active: Mapped[bool] = mapped_column(Boolean, default=False)
    note: Mapped[str] = mapped_column(Text, default="")
