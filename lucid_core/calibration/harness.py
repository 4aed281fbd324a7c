"""Calibration harness: each configuration alone, then every pair on one GPU, through a runtime executor.

A trial is one run on the host (one `HostExecutor.launch`): a shell command that starts one or
two workload processes which all begin measuring at the same host-clock second and keep
training until the last has finished, with the runtime's telemetry agent sampling the GPU next
to them. Results are appended to the journal and the catalog CSVs are rewritten after every
trial, so an interrupted calibration resumes where it stopped: measured trials are skipped, and
a trial whose run is still on the host (same run id) is collected instead of launched again. An
interrupt (KeyboardInterrupt) stops the runs this calibration started before it ends the calibration.
With MPS sharing the control daemon runs on the host for the calibration's runs (`mps`).
"""

from __future__ import annotations

import hashlib
import math
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from lucid_core.calibration.catalog import SHARING_MECHANISMS, CatalogFiles, write_catalog, write_environment
from lucid_core.calibration.configs import WorkloadConfig, all_pairs
from lucid_core.calibration.emulation import EmulatedProfiles
from lucid_core.calibration.journal import (
    FailedTrial,
    Journal,
    PairRecord,
    RefusedPair,
    SoloRecord,
    pair_key,
    record_problem,
    trial_id,
)
from lucid_core.calibration.mps import MpsDaemon, MpsUnavailable
from lucid_core.calibration.workloads.protocol import WorkloadResult, parse_events, parse_results
from lucid_core.runtime.hosts import telemetry, telemetry_agent
from lucid_core.runtime.hosts.executor import (
    GpuInfo,
    HostAddress,
    HostCommandFailed,
    HostExecutor,
    HostUnreachable,
    LaunchSpec,
    RunStatus,
)
from lucid_core.runtime.hosts.launch import TelemetryLaunch

TAGS = ("A", "B")
Measured = TypeVar("Measured", SoloRecord, PairRecord)


class TrialFailed(RuntimeError):
    """A trial ran but gave no usable measurement (crash, timeout, no result, windows not overlapping)."""


class CalibrationInterrupted(RuntimeError):
    """The calibration was interrupted: its runs on the host were stopped; the journal keeps what was measured."""

    def __init__(self, measured: int, total: int) -> None:
        super().__init__(f"interrupted: measured {measured} of {total} runs")
        self.measured = measured
        self.total = total


@dataclass(frozen=True)
class CalibrationSettings:
    """How long and how carefully to measure; defaults suit a real GPU (60 s windows, 1 s samples)."""

    seconds: float = 60.0
    warmup_s: float = 5.0
    startup_s: float = 20.0  # expected process start (import torch, init CUDA): for time budgets and estimates
    hold_s: float = 2.0  # extra training after the window, so no process measures alone at the end
    start_margin_s: float = 0.5  # from the last partner being ready to the common start (> one step)
    telemetry_interval_s: float = 1.0
    device: str = "auto"
    threads: int = 0
    gpu_memory_mb: float | None = None  # None: the GPU's total memory as nvidia-smi reports it
    memory_headroom_mb: float = 512.0
    min_overlap: float = 0.8
    max_attempts: int = 2  # tries per trial in one invocation; a later invocation tries failed trials again
    poll_interval_s: float = 1.0
    timeout_slack_s: float = 120.0
    tiny_threshold: float = 0.95
    medium_threshold: float = 0.85
    workload_module: str = "lucid_core.calibration.workloads"  # what `python -m` runs on the host

    def trial_budget_s(self) -> float:
        """Wall time one trial is expected to take on the host."""
        return self.startup_s + self.warmup_s + self.start_margin_s + self.seconds + self.hold_s + 1.0


@dataclass(frozen=True)
class CalibrationTarget:
    """One GPU on one host; pythonpath is set on the host so `python -m lucid_core...` resolves there."""

    host: HostAddress
    gpu: int = 0
    pythonpath: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the workload processes
    sharing: str = "time-slice"  # how a pair shares the GPU: time-slice (the driver's default) or mps

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MECHANISMS:
            raise ValueError(f"sharing {self.sharing!r} is not one of {', '.join(SHARING_MECHANISMS)}")


@dataclass(frozen=True)
class Trial:
    configs: tuple[WorkloadConfig, ...]

    @property
    def id(self) -> str:
        return trial_id(self.configs)

    @property
    def is_pair(self) -> bool:
        return len(self.configs) == 2


@dataclass
class CalibrationReport:
    """What a calibration did: trials measured, skipped as already measured, refused and failed."""

    measured: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    files: CatalogFiles | None = None
    environment: dict[str, Any] = field(default_factory=dict)


def telemetry_launch(python: str, gpu: int, interval_s: float, duration_s: float,
                     emulated: tuple[float, float, float] | None, seed: int) -> TelemetryLaunch:
    """The runtime telemetry agent shipped as source, named by its content hash."""
    source = Path(telemetry_agent.__file__).read_text(encoding="utf-8")
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    return TelemetryLaunch(agent_source=source, agent_name=f"lucid-telemetry-{digest}.py", python=python,
                           gpu_indices=(gpu,), interval_s=interval_s, duration_s=duration_s,
                           emulated=emulated, seed=seed)


def trial_command(trial: Trial, target: CalibrationTarget, settings: CalibrationSettings,
                  module: str = "lucid_core.calibration.workloads") -> str:
    """Shell command of one trial: one workload process per configuration, meeting in ./sync to measure together."""
    python = shlex.quote(target.host.python)
    lines = ["mkdir -p sync"]
    for tag, config in zip(TAGS, trial.configs, strict=False):
        args = [*config.workload_args(), "--seconds", f"{settings.seconds:g}", "--warmup", f"{settings.warmup_s:g}",
                "--device", settings.device, "--threads", str(settings.threads), "--tag", tag,
                "--sync-dir", "sync", "--parties", str(len(trial.configs)), "--hold", f"{settings.hold_s:g}",
                "--start-margin", f"{settings.start_margin_s:g}"]
        lines.append(f"{python} -m {module} run {shlex.join(args)} &")
        lines.append(f"p{tag}=$!")
    lines.append("rc=0")
    lines += [f"wait $p{tag} || rc=1" for tag in TAGS[: len(trial.configs)]]
    lines.append("exit $rc")
    return "\n".join(lines)


def window_samples(samples: Sequence[dict[str, Any]], start: float, end: float,
                   slack_s: float) -> list[dict[str, Any]]:
    """Telemetry samples taken inside the measured window (widened by one sampling interval)."""
    return [s for s in samples if start - slack_s <= float(s.get("t", -math.inf)) <= end + slack_s]


def result_problem(result: WorkloadResult) -> str | None:
    """What makes a process's result line no measurement (None: it is one): its speeds must be finite positive
    numbers over a window that ends after it starts. A speed of 0 divided every pair of it by zero (the whole
    calibration stopped with a traceback); a stalled one made every pair of it look many times faster."""
    numbers = {"iters_per_s": result.iters_per_s, "samples_per_s": result.samples_per_s,
               "measure_start": result.measure_start, "measure_end": result.measure_end}
    for name, value in numbers.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            return f"process {result.tag or '?'} reported {name} {value!r}: not a finite number"
    if result.iters_per_s <= 0 or result.samples_per_s <= 0:
        return f"process {result.tag or '?'} ran at {result.iters_per_s!r} iterations/s: no positive speed"
    if result.measure_end <= result.measure_start:
        return f"process {result.tag or '?'} measured no window ({result.measure_start!r} to {result.measure_end!r})"
    return None


def overlap_fraction(results: Sequence[WorkloadResult]) -> float:
    """Share of the longest measured window during which every process was measuring."""
    start = max(r.measure_start for r in results)
    end = min(r.measure_end for r in results)
    longest = max(r.measure_end - r.measure_start for r in results)
    return max(0.0, end - start) / longest if longest > 0 else 0.0


class Calibrator:
    """Runs a calibration on one GPU of one host and keeps the catalog in `out_dir` up to date."""

    def __init__(self, executor: HostExecutor, target: CalibrationTarget, out_dir: str | Path,
                 settings: CalibrationSettings | None = None, emulation: EmulatedProfiles | None = None,
                 progress: TextIO | None = sys.stderr, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.executor = executor
        self.target = target
        self.out_dir = Path(out_dir)
        self.settings = settings or CalibrationSettings()
        self.emulation = emulation
        self.progress = progress
        self.clock = clock
        self.sleep = sleep
        self.journal = Journal.open(self.out_dir)
        for line in self.journal.rejected:  # measured again: say why the journal's record was not believed
            self._warn(f"warning: not believed, measured again: {line}")
        ident = f"{self.out_dir.resolve()}|{target.host.name}|{target.gpu}|{self.settings.seconds:g}"
        self.catalog_id = hashlib.sha256(ident.encode()).hexdigest()[:8]
        self._gpu_info: GpuInfo | None = None
        self._gpu_asked = False
        self._mps: MpsDaemon | None = None
        self._live: dict[str, None] = {}  # run ids launched (or being launched) and not yet seen ending
        self._current: tuple[Trial, int] | None = None  # the trial and attempt being measured

    # ---- planning -----------------------------------------------------------------------
    def host_gpu(self) -> GpuInfo | None:
        """The calibrated GPU as nvidia-smi on the host reports it (None without one); asked once."""
        if not self._gpu_asked:
            self._gpu_info = next((g for g in self.executor.discover_gpus(self.target.host)
                                   if g.index == self.target.gpu), None)
            self._gpu_asked = True
        return self._gpu_info

    def gpu_model(self, environment: Mapping[str, Any]) -> str | None:
        """The GPU name for environment.json: nvidia-smi's, else torch's; the emulation's when emulating."""
        if self.emulation is not None:
            return self.emulation.gpu_model
        info = self.host_gpu()
        if info is not None and info.model:
            return info.model
        gpus = environment.get("gpus")
        return str(gpus[0]) if isinstance(gpus, list) and gpus else None

    def gpu_memory_mb(self) -> float:
        """Capacity for the memory check: the setting, else nvidia-smi's total, else an error."""
        if self.settings.gpu_memory_mb is not None:
            return self.settings.gpu_memory_mb
        info = self.host_gpu()
        if info is not None:
            return info.memory_mb
        raise TrialFailed(f"host {self.target.host.name} reports no GPU {self.target.gpu} through nvidia-smi; "
                          "pass the GPU memory explicitly (--gpu-memory-mb) when emulating telemetry")

    def fits(self, a: WorkloadConfig, b: WorkloadConfig, capacity_mb: float) -> tuple[bool, str]:
        """Whether two measured footprints plus the headroom fit on the GPU, with the numbers."""
        need = self.journal.solos[a.key].gpu_mem_mb + self.journal.solos[b.key].gpu_mem_mb
        total = need + self.settings.memory_headroom_mb
        why = (f"{a.key} + {b.key} need {need:.0f} MB + {self.settings.memory_headroom_mb:.0f} MB headroom "
               f"= {total:.0f} MB of {capacity_mb:.0f} MB")
        return total <= capacity_mb, why

    def run_id(self, trial: Trial, attempt: int) -> str:
        return f"calib-{self.catalog_id}-{trial.id}-a{attempt}"

    # ---- one trial ----------------------------------------------------------------------
    def _emulated_triple(self, trial: Trial) -> tuple[float, float, float] | None:
        if self.emulation is None:
            return None
        return self.emulation.pair(*trial.configs) if trial.is_pair else self.emulation.solo(trial.configs[0])

    def _env(self) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": str(self.target.gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
               "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
        if self.target.pythonpath:
            env["PYTHONPATH"] = self.target.pythonpath
        mps = self._mps.client_env() if self._mps is not None and self._mps.directory is not None else {}
        return {**env, **mps, **self.target.env}

    def _wait(self, run_id: str, least_s: float = 0.0) -> RunStatus:
        """Poll the run until it ends; the first poll waits `least_s`, the shortest the run can take."""
        deadline = self.clock() + self.settings.trial_budget_s() + self.settings.timeout_slack_s
        host = self.target.host
        self.sleep(least_s)
        while True:
            status = self.executor.poll(host, [run_id]).get(run_id, RunStatus("MISSING"))
            if status.state in {"EXITED", "VANISHED", "MISSING"}:
                self._live.pop(run_id, None)
                return status
            if self.clock() > deadline:
                self.executor.stop(host, run_id, "calibration trial timed out", grace_s=5.0)
                self._live.pop(run_id, None)
                raise TrialFailed(f"{run_id} did not finish within its time budget; stopped")
            self.sleep(self.settings.poll_interval_s)

    def run_trial(self, trial: Trial, attempt: int) -> list[WorkloadResult]:
        """Launch (or rejoin) the trial's run, wait for it, and return each process's result."""
        host, s = self.target.host, self.settings
        run_id = self.run_id(trial, attempt)
        tel = telemetry_launch(host.python, self.target.gpu, s.telemetry_interval_s,
                               s.trial_budget_s() + s.timeout_slack_s, self._emulated_triple(trial),
                               seed=attempt)
        command = trial_command(trial, self.target, s, s.workload_module)
        self._live[run_id] = None  # before the launch: an interrupt during it still stops the run
        launched = self.executor.launch(host, LaunchSpec(run_id, command, self._env(), tel))
        shortest = 0.0 if launched.already_launched else s.warmup_s + s.seconds + s.hold_s
        status = self._wait(run_id, least_s=shortest)
        stdout = self.executor.read(host, run_id, "stdout.log")
        if status.state != "EXITED" or status.exit_code != 0:
            stderr = self.executor.read(host, run_id, "stderr.log", max_bytes=2000)
            raise TrialFailed(f"{run_id} ended {status.state} (exit {status.exit_code}): {stderr.strip()[-800:]}")
        results = parse_results(stdout)
        missing = [t for t in TAGS[: len(trial.configs)] if t not in results]
        if missing:
            raise TrialFailed(f"{run_id}: no result from process(es) {missing}; output: {stdout.strip()[-400:]}")
        ordered = [results[t] for t in TAGS[: len(trial.configs)]]
        problem = next((p for p in map(result_problem, ordered) if p is not None), None)
        if problem is not None:
            raise TrialFailed(f"{run_id}: {problem}")
        return ordered

    @staticmethod
    def _believed(record: Measured) -> Measured:
        """`record` if it is a measurement the catalog may hold; TrialFailed naming its run and why if not."""
        problem = record_problem(record)
        if problem is not None:
            raise TrialFailed(f"{record.run_id}: {problem}")
        return record

    def _profile(self, run_id: str, results: Sequence[WorkloadResult]) -> dict[str, Any]:
        samples = telemetry.parse_samples(self.executor.read(self.target.host, run_id, "telemetry.jsonl", 8 << 20))
        start = max(r.measure_start for r in results)
        end = min(r.measure_end for r in results)
        inside = window_samples(samples, start, end, self.settings.telemetry_interval_s)
        profile = telemetry.summarize(inside)
        if not profile.get("samples"):
            err = self.executor.read(self.target.host, run_id, "telemetry.err", 2000)
            raise TrialFailed(f"{run_id}: no telemetry samples in the measured window "
                              f"({len(samples)} samples in all); agent said: {err.strip()[-400:]}")
        return profile

    def measure_solo(self, config: WorkloadConfig, attempt: int) -> SoloRecord:
        trial = Trial((config,))
        (result,) = self.run_trial(trial, attempt)
        run_id = self.run_id(trial, attempt)
        profile = self._profile(run_id, [result])
        return self._believed(SoloRecord(
            config=config, iters_per_s=result.iters_per_s, samples_per_s=result.samples_per_s,
            gpu_util=profile["gpu_util"], mem_util=profile["mem_util"], gpu_mem_mb=profile["gpu_mem_mb"],
            telemetry_samples=profile["samples"], emulated=bool(profile["emulated"]), run_id=run_id,
            host=self.target.host.name, gpu=self.target.gpu, device=result.device, gpu_name=result.gpu_name,
            torch_version=result.torch_version, measured_at=self.clock()))

    def measure_pair(self, a: WorkloadConfig, b: WorkloadConfig, attempt: int) -> PairRecord:
        trial = Trial((a, b))
        ra, rb = self.run_trial(trial, attempt)
        run_id = self.run_id(trial, attempt)
        overlap = overlap_fraction([ra, rb])
        if overlap < self.settings.min_overlap:
            raise TrialFailed(f"{run_id}: the two processes measured together only {overlap:.0%} of the window "
                              f"(need {self.settings.min_overlap:.0%}); lengthen the window or the hold")
        profile = self._profile(run_id, [ra, rb])
        solo_a, solo_b = self.journal.solos[a.key], self.journal.solos[b.key]
        return self._believed(PairRecord(
            first=a, second=b, speed_first=ra.iters_per_s / solo_a.iters_per_s,
            speed_second=rb.iters_per_s / solo_b.iters_per_s, iters_per_s_first=ra.iters_per_s,
            iters_per_s_second=rb.iters_per_s, gpu_util=profile["gpu_util"], mem_util=profile["mem_util"],
            gpu_mem_mb=profile["gpu_mem_mb"], overlap=overlap, telemetry_samples=profile["samples"],
            emulated=bool(profile["emulated"]), run_id=run_id, host=self.target.host.name, gpu=self.target.gpu,
            measured_at=self.clock()))

    # ---- the whole calibration ----------------------------------------------------------
    def probe_environment(self) -> dict[str, Any]:
        """Ask the host (as a short run) for its torch, CUDA, driver and GPU names."""
        host = self.target.host
        run_id = f"calib-{self.catalog_id}-env-{int(self.clock())}"
        command = f"{shlex.quote(host.python)} -m {self.settings.workload_module} env"
        self._live[run_id] = None
        self.executor.launch(host, LaunchSpec(run_id, command, self._env()))
        status = self._wait(run_id)
        out = self.executor.read(host, run_id, "stdout.log")
        envs = [e for e in parse_events(out) if e.get("event") == "env"]
        if status.exit_code != 0 or not envs:
            err = self.executor.read(host, run_id, "stderr.log", 2000)
            raise TrialFailed(f"host {host.name} cannot run the workloads (is torch installed? the "
                              f"'workloads' extra): {err.strip()[-600:]}")
        env = {k: v for k, v in envs[-1].items() if k != "event"}
        env.update({"host": host.name, "gpu_index": self.target.gpu,
                    "telemetry": "emulated" if self.emulation is not None else "nvml",
                    "emulation_source": self.emulation.source if self.emulation is not None else "",
                    "sharing": self.target.sharing,
                    "seconds": self.settings.seconds, "warmup_s": self.settings.warmup_s})
        return env

    def _attempts(self, trial: Trial) -> range:
        """Attempt numbers for this invocation, after those the journal already records as failed."""
        first = self.journal.failures.get(trial.id, 0) + 1
        return range(first, first + self.settings.max_attempts)

    def run(self, configs: Sequence[WorkloadConfig]) -> CalibrationReport:
        """Measure every configuration alone, then every pair that fits; rewrite the catalog after each.

        With MPS sharing the control daemon is started first and quit at the end, however it ends. On a
        KeyboardInterrupt the runs started on the host are stopped and CalibrationInterrupted is raised.
        """
        solos = [Trial((c,)) for c in configs]
        pairs = [Trial(p) for p in all_pairs(list(configs))]
        try:
            if self.target.sharing == "mps":
                self._start_mps()
            return self._measure(solos, pairs)
        except KeyboardInterrupt:
            self._stop_live_runs("the calibration was interrupted")
            raise CalibrationInterrupted(*self.progress_counts(solos + pairs)) from None
        finally:
            self._stop_mps()

    def progress_counts(self, trials: Sequence[Trial]) -> tuple[int, int]:
        """(measured, to measure) of `trials` by the journal; pairs refused for memory count in neither."""
        measured = refused = 0
        for trial in trials:
            if self._measured(trial):
                measured += 1
            elif trial.is_pair and pair_key(*trial.configs) in self.journal.refused:
                refused += 1
        return measured, len(trials) - refused

    def _measured(self, trial: Trial) -> bool:
        """Whether the journal holds this trial's measurement (from this invocation or an earlier one)."""
        if trial.is_pair:
            return self.journal.has_pair(*trial.configs)
        return trial.configs[0].key in self.journal.solos

    def _start_mps(self) -> None:
        """Start the host's MPS daemon on the GPU (named by UUID when nvidia-smi gives one: MPS renumbers)."""
        info = self.host_gpu()
        self._mps = MpsDaemon(self.executor, self.target.host, self.target.gpu,
                              info.uuid if info is not None and info.uuid else None)
        self._mps.start()

    def _stop_mps(self) -> None:
        """Quit the MPS daemon if a start was sent; a failure to quit is a warning, never the outcome."""
        daemon, self._mps = self._mps, None
        if daemon is None or not daemon.attempted:
            return
        try:
            daemon.stop()
        except (MpsUnavailable, HostUnreachable, HostCommandFailed) as exc:
            self._warn(f"warning: {exc}")

    def _stop_live_runs(self, reason: str) -> None:
        """Stop the runs this calibration launched and has not seen end; the trial in hand counts as failed."""
        host = self.target.host
        for run_id in list(self._live):
            try:
                self.executor.stop(host, run_id, reason, grace_s=5.0)
            except (HostUnreachable, HostCommandFailed) as exc:
                self._warn(f"warning: could not stop run {run_id} on {host.name}: {exc}")
            self._live.pop(run_id, None)
        if self._current is not None and not self._measured(self._current[0]):
            trial, attempt = self._current
            # the next invocation then launches a fresh attempt instead of rejoining the stopped run
            self.journal.append(FailedTrial(trial.configs, self.run_id(trial, attempt), attempt, f"stopped: {reason}"))
        self._current = None

    def _warn(self, text: str) -> None:
        print(text, file=self.progress or sys.stderr)

    def _measure(self, solos: list[Trial], pairs: list[Trial]) -> CalibrationReport:
        """Probe the host, record its environment, then measure what the journal lacks (run's body)."""
        report = CalibrationReport()
        report.environment = self.probe_environment()
        if self.emulation is None and report.environment.get("nvml_error"):
            raise TrialFailed(f"host {self.target.host.name} has no working NVML for telemetry "
                              f"({report.environment['nvml_error']}); on a host without an NVIDIA GPU use "
                              "--emulate and --gpu-memory-mb")
        capacity = self.gpu_memory_mb()
        report.environment["gpu_memory_mb"] = capacity
        report.environment["gpu_model"] = self.gpu_model(report.environment)
        write_environment(self.out_dir, report.environment)
        todo_solo = [t for t in solos if t.configs[0].key not in self.journal.solos]
        todo_pairs = [t for t in pairs if not self.journal.has_pair(*t.configs)]
        report.skipped += [t.id for t in solos + pairs if t not in todo_solo and t not in todo_pairs]
        bar = _Progress(len(todo_solo) + len(todo_pairs), self.settings.trial_budget_s(), self.progress)
        try:
            for trial in todo_solo:
                self._do(trial, report, bar, lambda t, n: self.journal.append(self.measure_solo(t.configs[0], n)))
            for trial in todo_pairs:
                a, b = trial.configs
                if a.key not in self.journal.solos or b.key not in self.journal.solos:
                    report.failed.append(f"{trial.id} (a solo measurement is missing)")
                    bar.step(trial.id, measured=False)
                    continue
                ok, why = self.fits(a, b, capacity)
                if not ok:
                    if pair_key(a, b) not in self.journal.refused:
                        self.journal.append(RefusedPair(a, b, f"does not fit: {why}"))
                    report.refused.append(f"{trial.id}: {why}")
                    bar.step(trial.id, measured=False)
                    continue
                self._do(trial, report, bar, lambda t, n: self.journal.append(self.measure_pair(*t.configs, n)))
        finally:
            bar.close()
        report.files = write_catalog(self.journal, self.out_dir, self.settings.tiny_threshold,
                                     self.settings.medium_threshold)
        return report

    def _do(self, trial: Trial, report: CalibrationReport, bar: _Progress,
            measure: Callable[[Trial, int], None]) -> None:
        began = self.clock()
        for attempt in self._attempts(trial):
            self._current = (trial, attempt)
            try:
                measure(trial, attempt)
            except TrialFailed as exc:
                self.journal.append(FailedTrial(trial.configs, self.run_id(trial, attempt), attempt, str(exc)))
                bar.note(f"{trial.id} attempt {attempt} failed: {exc}")
                continue
            self._current = None
            report.measured.append(trial.id)
            write_catalog(self.journal, self.out_dir, self.settings.tiny_threshold, self.settings.medium_threshold)
            bar.step(trial.id, measured=True, took_s=self.clock() - began)
            return
        self._current = None
        report.failed.append(trial.id)
        bar.step(trial.id, measured=False)


class _Progress:
    """A tqdm bar over the trials left, with an estimate of the time left from the trials so far."""

    def __init__(self, total: int, estimate_s: float, stream: TextIO | None) -> None:
        self.left = total
        self.estimate_s = estimate_s
        self.took: list[float] = []
        self.stream = stream
        self.bar = None
        if stream is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="run", file=stream, dynamic_ncols=True, desc="calibrating")
            self.bar.set_postfix_str(self.eta())

    def eta(self) -> str:
        per_trial = sum(self.took) / len(self.took) if self.took else self.estimate_s
        return f"about {self.left * per_trial / 60:.1f} min left"

    def step(self, name: str, *, measured: bool, took_s: float | None = None) -> None:
        self.left -= 1
        if took_s is not None:
            self.took.append(took_s)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{name} {'done' if measured else 'skipped'}; {self.eta()}")

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
