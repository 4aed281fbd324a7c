"""What a round sends to launch a run: its command (an MPS client on MPS hosts), its environment (GPUs, rank,
master), and the telemetry agent that profiles or watches it, with the windows those cover."""

from __future__ import annotations

from sqlalchemy import select

from lucid_core.domain import Pool
from lucid_core.policy.view import saved_number
from lucid_core.runtime.hosts.executor import LaunchSpec
from lucid_core.runtime.hosts.launch import TelemetryLaunch
from lucid_core.runtime.hosts.mps import memory_limit_mb, mps_client_command
from lucid_core.runtime.round.base import WATCH_S, RoundBase, agent_source
from lucid_core.runtime.round.settings import emulated_profile_from_catalog
from lucid_core.runtime.store.schema import JobRow, RunRow


class LaunchSpecSteps(RoundBase):
    """The launch a round sends for a planned run."""

    def _launch_spec(self, run: RunRow, job: JobRow) -> LaunchSpec:
        host = self._hosts[run.host]
        with self.store.session() as s:
            peers = list(s.scalars(select(RunRow).where(RunRow.run_id == run.run_id).order_by(RunRow.node_rank)))
        master = self._hosts[peers[0].host].address if peers else host.address
        stored = job.env or {}
        if not isinstance(stored, dict):
            raise ValueError(f"env {str(stored)[:60]!r} is not a mapping of variable names to values")
        env = dict(stored)
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in run.gpu_indices),
            "LUCID_JOB_ID": job.job_id, "LUCID_RUN_ID": run.run_id,
            "LUCID_NODE_RANK": str(run.node_rank), "LUCID_NUM_NODES": str(max(1, len(peers))),
            "LUCID_MASTER_ADDR": master, "LUCID_NUM_GPUS": str(job.gpus),
        })
        telemetry = None
        windowed = run.profiling_until is not None
        # main runs that may share are watched for their whole life: their speed beside a partner
        watched = run.pool == Pool.MAIN.value and not job.no_share and (job.profiled or windowed)
        if (windowed or watched) and run.node_rank == 0:
            source, digest = agent_source()
            emulated = None
            if host.telemetry == "emulated":
                emulated = self._emulated(job)
            telemetry = TelemetryLaunch(
                agent_source=source, agent_name=f"lucid_telemetry_{digest}.py", python=host.python,
                gpu_indices=tuple(run.gpu_indices),
                interval_s=self.settings.telemetry_interval_s if windowed else self.settings.monitor_interval_s,
                duration_s=WATCH_S if watched else self._window_s(run) + self.settings.telemetry_margin_s,
                emulated=emulated, seed=job.seq,
                # a watching agent bounds its file: the profiling window whole, then speed samples only
                keep_all_s=(self._kept_window_s(run) if windowed else 0.0) if watched else None,
                # profiled in place and watched: dense samples for the window, the watch's rate after it
                watch_interval_s=self.settings.monitor_interval_s if windowed and watched else None)
        command = job.command
        if host.sharing == "mps" and run.pool == Pool.MAIN.value and len(peers) <= 1:
            # an MPS client of its GPU set's daemon (every main run there: the GPU is the daemon's), limited to
            # its profiled footprint plus headroom: none before its profile, nor for a job that never shares
            # (no partner to keep room for). Profiling-pool runs never share and must measure the job alone, as
            # it runs outside MPS; multi-host jobs never share either: both run as they are
            limit = None if job.no_share else memory_limit_mb(job.gpu_mem_mb, self.config.binder.memory_headroom_mb)
            command = mps_client_command(command, host.workdir, run.gpu_indices, run.run_id, limit,
                                         as_submitter=host.run_as == "submitter")
        return LaunchSpec(run.run_id, command, env, telemetry, user=job.user, job_id=job.job_id,
                          gpu_indices=tuple(run.gpu_indices), partner=run.partner)

    @staticmethod
    def _window_s(run: RunRow) -> float:
        """Length of a run's profiling window (its end is rebased to the launch once launched)."""
        begin = run.started_at if run.started_at is not None else run.planned_at
        end = run.profiling_until or begin
        # a row another controller wrote may hold an infinite, negative or text time: a window is 1 s to a day
        if not (saved_number(begin) and saved_number(end)):
            return 1.0
        return min(max(1.0, end - begin), 86400.0)

    def _kept_window_s(self, run: RunRow) -> float:
        """How long from its start a watching agent keeps every sample: the profile's window, a sample over."""
        return self._window_s(run) + self.settings.telemetry_margin_s + self.settings.telemetry_interval_s

    def _emulated(self, job: JobRow) -> tuple[float, float, float]:
        if self._emulated_profile is None:
            from lucid_core.sim.catalog import WorkloadCatalog

            catalog = (WorkloadCatalog.from_artifact(self.settings.catalog_dir) if self.settings.catalog_dir
                       else WorkloadCatalog.synthetic())
            self._emulated_profile = emulated_profile_from_catalog(catalog)
        return self._emulated_profile(job)
