"""Hosts and their GPUs: add (declared or discovered over the executor), list, drain, remove."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from lucid_core.domain import ACTIVE_RUN_STATES, SHARING_MECHANISMS, JobState, Pool, RunState
from lucid_core.policy.placement import fleet_could_hold
from lucid_core.policy.view import saved_indices
from lucid_core.runtime.hosts.executor import GpuInfo, HostAddress, HostExecutor
from lucid_core.runtime.hosts.inputs import os_user_problem
from lucid_core.runtime.store.lease import admin_lease
from lucid_core.runtime.store.schema import GpuRow, HostRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store

ADMIN_WAIT_S = 60.0  # how long an inventory change waits for a running round to give the lease back
#: the states of a job that will next wait for main GPUs (one being profiled among them)
NOT_ON_MAIN_YET = (JobState.SUBMITTED.value, JobState.PROFILING.value, JobState.QUEUED.value)
RUN_AS_MODES = ("account", "submitter")  # whom a host runs jobs as: its SSH account, or each job's user


class InventoryError(ValueError):
    """A host operation was refused (unknown host, duplicate name, busy host, bad field)."""


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str = "127.0.0.1"
    port: int = 22
    user: str = ""
    key_path: str | None = None
    vc: str = "default"
    pool: str = "main"
    executor: str = "ssh"
    telemetry: str = "nvml"
    workdir: str = "~/.lucid-runs"
    python: str = "python3"
    gpus: int | None = None  # declared count; None: discover over the executor
    gpu_memory_mb: float = 24576.0
    run_as: str = "account"  # submitter: each job runs as the OS user named by the job's `user` (sudo -n -u)
    sharing: str = "time-slice"  # none | time-slice | mps: how two jobs would share one of its GPUs
    gpu_model: str | None = None  # declared GPU model; discovered hosts take nvidia-smi's name


def host_address(row: HostRow) -> HostAddress:
    return HostAddress(row.name, row.address, row.port, row.user, row.key_path, row.workdir, row.python,
                       row.executor, row.run_as or "account", row.sharing or "time-slice")


def _check(spec: HostSpec) -> None:
    problems = []
    if not spec.name or len(spec.name) > 128 or any(c.isspace() for c in spec.name):
        problems.append("name: must be 1-128 characters without spaces")
    if spec.pool not in {p.value for p in Pool}:
        problems.append(f"pool: {spec.pool!r} is not main or profiling")
    if spec.executor not in {"ssh", "local"}:
        problems.append(f"executor: {spec.executor!r} is not ssh or local")
    if spec.telemetry not in {"nvml", "emulated"}:
        problems.append(f"telemetry: {spec.telemetry!r} is not nvml or emulated")
    if spec.run_as not in RUN_AS_MODES:
        problems.append(f"run_as: {spec.run_as!r} is not account or submitter")
    if spec.sharing not in SHARING_MECHANISMS:
        problems.append(f"sharing: {spec.sharing!r} is not one of {', '.join(SHARING_MECHANISMS)}")
    if spec.gpu_model is not None and not (0 < len(spec.gpu_model.strip()) <= 128):
        problems.append("gpu_model: must be 1-128 characters")
    if not 0 < spec.port < 65536:
        problems.append(f"port: {spec.port} is not a TCP port")
    if spec.gpus is not None and not 1 <= spec.gpus <= 64:
        problems.append(f"gpus: {spec.gpus} must be between 1 and 64")
    if spec.gpu_memory_mb <= 0:
        problems.append(f"gpu_memory_mb: {spec.gpu_memory_mb} must be positive")
    if problems:
        raise InventoryError("; ".join(problems))


def add_host(store: Store, spec: HostSpec, executor: HostExecutor | None = None, *,
             wait_s: float = ADMIN_WAIT_S) -> list[GpuInfo]:
    """Register a host; GPUs are declared (spec.gpus) or discovered with nvidia-smi over the executor.
    Discovery runs before the lease is taken; the write is serialised with rounds."""
    _check(spec)
    row = HostRow(name=spec.name, address=spec.address, port=spec.port, user=spec.user, key_path=spec.key_path,
                  vc=spec.vc, pool=spec.pool, executor=spec.executor, telemetry=spec.telemetry,
                  workdir=spec.workdir, python=spec.python, gpu_memory_mb=spec.gpu_memory_mb,
                  run_as=spec.run_as, sharing=spec.sharing,
                  gpu_model=spec.gpu_model.strip() if spec.gpu_model else None, added_at=store.now())
    if spec.gpus is not None:
        gpus = [GpuInfo(i, row.gpu_model or "declared", spec.gpu_memory_mb) for i in range(spec.gpus)]
        declared = True
    else:
        if executor is None:
            raise InventoryError("gpus: give a count, or an executor to discover them")
        gpus = executor.discover_gpus(host_address(row))
        if not gpus:
            raise InventoryError(f"host {spec.name}: no NVIDIA GPU found; declare the count (lucid hosts add --gpus N)")
        row.gpu_memory_mb = min(g.memory_mb for g in gpus)
        models = sorted({g.model for g in gpus})
        if spec.gpu_model is None and len(models) == 1:
            row.gpu_model = models[0]
        elif spec.gpu_model is None:
            raise InventoryError(f"host {spec.name}: GPUs of several models ({', '.join(models)}); packing labels "
                                 "are per GPU model, so register each model's GPUs as its own entry")
        declared = False
    with admin_lease(store, f"add {spec.name}", wait_s=wait_s) as fenced, fenced.session() as s:
        if s.get(HostRow, spec.name) is not None:
            raise InventoryError(f"host {spec.name} already exists")
        twin = same_machine_entry(s.scalars(select(HostRow)).all(), row)
        if twin is not None:
            raise InventoryError(
                f"host {spec.name}: entry {twin} already reaches {row.address}:{row.port} with work directory "
                f"{row.workdir}; two entries would share one ledger of live runs and each refuse the other's GPUs. "
                "Give this entry its own --workdir, or declare all the machine's GPUs on one entry")
        s.add(row)
        s.flush()
        for g in gpus:
            s.add(GpuRow(host=spec.name, index=g.index, model=g.model, memory_mb=g.memory_mb, uuid=g.uuid,
                         declared=declared))
    return gpus


def same_machine_entry(rows: list[HostRow], new: HostRow) -> str | None:
    """The name of an entry that reaches the same machine account and work directory as `new`, if any."""
    def place(row: HostRow) -> tuple[str, str, int, str, str]:
        workdir = (row.workdir or "").rstrip("/") or "/"
        user = row.user if workdir.startswith("~") or row.executor == "ssh" else ""
        return (row.executor, row.address.strip().lower(), row.port, user, workdir)

    target = place(new)
    return next((row.name for row in rows if place(row) == target), None)


def list_hosts(store: Store) -> list[dict[str, object]]:
    with store.session() as s:
        hosts = s.scalars(select(HostRow).order_by(HostRow.name)).all()
        gpus = s.execute(select(GpuRow.host, GpuRow.index)).all()
        busy = s.execute(select(RunRow.host, RunRow.gpu_indices).where(RunRow.state.in_(ACTIVE_RUN_STATES))).all()
    count: dict[str, int] = {}
    for host, _ in gpus:
        count[host] = count.get(host, 0) + 1
    used: dict[str, set[int]] = {}
    for host, indices in busy:  # read as untrusted: a hand edit can leave anything there
        used.setdefault(host, set()).update(saved_indices(indices))
    return [{"name": h.name, "address": f"{h.address}:{h.port}", "user": h.user, "vc": h.vc, "pool": h.pool,
             "executor": h.executor, "telemetry": h.telemetry, "run_as": h.run_as,
             "gpu_model": h.gpu_model, "sharing": h.sharing, "gpus": count.get(h.name, 0),
             "busy_gpus": len(used.get(h.name, ())), "draining": h.draining, "reachable": h.reachable,
             "last_error": h.last_error} for h in hosts]


def submitter_user_problem(store: Store, user: str, vc: str) -> str | None:
    """Why `user` cannot be a job's user in `vc` (None when it can): the job may land on a host that runs
    jobs as their submitter (a main host of its VC, or any profiling host), so it must name an OS user."""
    with store.session() as s:
        hosts = s.scalars(select(HostRow.name).where(
            HostRow.run_as == "submitter", (HostRow.vc == vc) | (HostRow.pool == Pool.PROFILING.value))
            .order_by(HostRow.name).limit(1)).all()
    if not hosts:
        return None
    problem = os_user_problem(user)
    return None if problem is None else f"{problem} (host {hosts[0]} runs each job as its user)"


def drain_host(store: Store, name: str, draining: bool = True, *, remove: bool = False,
               wait_s: float = ADMIN_WAIT_S) -> None:
    """A draining host keeps its running jobs but gets no new ones; with `remove`, the round deletes it
    once nothing of it is planned or running. Serialised with rounds through the lease."""
    with admin_lease(store, f"drain {name}", wait_s=wait_s) as fenced, fenced.session() as s:
        row = s.get(HostRow, name)
        if row is None:
            raise InventoryError(f"no host {name!r}")
        row.draining = draining or remove
        row.remove_when_empty = remove and draining


@dataclass(frozen=True)
class Stranded:
    """Waiting jobs that VC `vc`'s main hosts hold today but would not once a host is gone."""

    vc: str
    gpus_left: int  # GPUs on the VC's main hosts once it is gone (hosts already being removed left out)
    jobs: list[tuple[str, int]]  # (job id, GPUs), in submission order


def stranded_without(store: Store, name: str) -> Stranded | None:
    """What removing main host `name` would strand: the waiting jobs of its VC that its main hosts (those not
    already being removed) could hold with it and could not without it, by the policy's rule (`fleet_could_hold`;
    node size: the largest host kept). None when there are none. Unreachable and draining hosts still count."""
    with store.session() as s:
        me = s.get(HostRow, name)
        if me is None or me.pool != Pool.MAIN.value:
            return None
        hosts = s.execute(select(HostRow.name, HostRow.vc, HostRow.pool, HostRow.remove_when_empty, GpuRow.index)
                          .join(GpuRow, GpuRow.host == HostRow.name)).all()
        waiting = s.execute(select(JobRow.job_id, JobRow.gpus).where(
            JobRow.vc == me.vc, JobRow.state.in_(NOT_ON_MAIN_YET))
            .order_by(JobRow.seq)).all()
    count: dict[str, int] = {}
    for host, _, _, leaving, _ in hosts:
        if not leaving or host == name:
            count[host] = count.get(host, 0) + 1
    size = max(count.values(), default=0)
    mine = {host: count[host] for host, vc, pool, _, _ in hosts
            if host in count and vc == me.vc and pool == Pool.MAIN.value}
    after = [n for host, n in mine.items() if host != name]
    size_after = max((n for host, n in count.items() if host != name), default=0)
    def holds(gpus: int, nodes: list[int], node_size: int) -> bool:
        return node_size > 0 and fleet_could_hold(gpus, nodes, node_size)

    jobs = [(job_id, gpus) for job_id, gpus in waiting if type(gpus) is int and gpus > 0
            and holds(gpus, list(mine.values()), size) and not holds(gpus, after, size_after)]
    return Stranded(me.vc, sum(after), jobs) if jobs else None


def remove_host(store: Store, name: str, *, wait_s: float = ADMIN_WAIT_S) -> None:
    """Forget a host that runs nothing (drain it and wait first).

    Holds the round lease while it checks and deletes, so a round cannot place work on the host between
    the check and the delete (a round's uncommitted placement is not visible to the check)."""
    with admin_lease(store, f"remove {name}", wait_s=wait_s) as fenced, fenced.session() as s:
        row = s.get(HostRow, name)
        if row is None:
            raise InventoryError(f"no host {name!r}")
        active = s.scalars(select(RunRow.run_id).where(RunRow.host == name,
                                                       RunRow.state.in_((*ACTIVE_RUN_STATES, RunState.LOST)))).all()
        if active:
            raise InventoryError(f"host {name} still runs {len(active)} job run(s) ({', '.join(active[:3])}); "
                                 "drain it and wait for them to end (lucid hosts drain --remove does both)")
        for gpu in s.scalars(select(GpuRow).where(GpuRow.host == name)).all():
            s.delete(gpu)
        s.delete(row)
