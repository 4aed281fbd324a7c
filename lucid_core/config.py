"""Every knob of the scheduler with the paper's default, in one typed object.

Load order: defaults, then a TOML or YAML file, then environment variables named
``LUCID__SECTION__KNOB`` (e.g. ``LUCID__PROFILER__TPROF_S=300``). Bad values raise
``ConfigError`` naming the knob, the value and what is allowed.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


def _knob(default: Any, *, lo: float | None = None, hi: float | None = None,
          choices: tuple[str, ...] | None = None, doc: str = "") -> Any:
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices, "doc": doc})


@dataclass(frozen=True)
class ProfilerConfig:
    tprof_s: float = _knob(200.0, lo=1, hi=86400, doc="profiling window per job (Tprof)")
    long_cold_start_tprof_s: float = _knob(600.0, lo=1, hi=86400, doc="window for long_cold_start jobs")
    nprof_gpus: int = _knob(8, lo=0, hi=1024, doc="widest job profiled on the pool (Nprof); wider run online")
    pool_nodes: int = _knob(2, lo=0, hi=10000, doc=(
        "profiling pool capacity in nodes (Cprof); a simulated cluster sets aside one node per 10 "
        "up to this, none under 10 nodes"))
    in_place: bool = _knob(True, doc="profile on the main cluster during the real run when it has room")
    autoscale: bool = _knob(True, doc="adapt Tprof and borrow idle main nodes from the throughput forecast")
    burst_tprof_s: float = _knob(100.0, lo=1, hi=86400, doc="Tprof while a submission burst is forecast")
    burst_jobs_per_slot: float = _knob(40.0, lo=0, doc="forecast submissions per slot that count as a burst")
    max_borrowed_nodes: int = _knob(4, lo=0, hi=10000, doc="idle main nodes the pool may borrow in a burst")
    enabled: bool = _knob(True, doc="ablation switch: profiler off sends jobs straight to the main queue")


@dataclass(frozen=True)
class BinderConfig:
    tiny_threshold: float = _knob(0.95, lo=0, hi=1, doc="mean co-located speed at or above: Tiny")
    medium_threshold: float = _knob(0.85, lo=0, hi=1, doc="mean co-located speed at or above: Medium")
    sharing: str = _knob("auto", choices=("auto", "on", "off"), doc=(
        "auto: the load forecast or the GPUs already queued (for the main queue or a profiling window), whichever "
        "is more, picks GSS 2/1/off"))
    low_load_gpus_per_slot: float = _knob(2.0, lo=0, doc=(
        "sharing is off while both the forecast GPUs per slot and the GPUs queued are below this"))
    apathetic_gpus_per_slot: float = _knob(8.0, lo=0, doc=(
        "GSS drops to 1 while both the forecast GPUs per slot and the GPUs queued are below this"))
    pair_priority_ratio: float = _knob(8.0, lo=1, doc="never pair a job with a partner this many times shorter")
    nearly_done_s: float = _knob(600.0, lo=0, doc="never pair with a job predicted to end within this many seconds")
    memory_headroom_mb: float = _knob(512.0, lo=0, doc="kept free on a shared GPU on top of both footprints")
    unstable_speed: float = _knob(0.7, lo=0, hi=1, doc="split a pair whose observed speed falls below this")


@dataclass(frozen=True)
class OrchestratorConfig:
    estimator: bool = _knob(True, doc="ablation switch: off orders the queue by arrival (FIFO) instead")
    aging: float = _knob(0.0, lo=0, doc=(
        "GPU-seconds of priority a queued job gains per second it waits (0: off; the guard bounds waits)"))
    guard_slowdown: float = _knob(16.0, lo=0, doc=(
        "starvation guard: a job waiting this many times its predicted run time (at least Tprof) goes "
        "ahead of the rest and gets a node reservation; 0 turns the guard off"))
    backfill_reserved: bool = _knob(True, doc=(
        "EASY backfilling: a job predicted to end before the guard's reserved job is predicted to start "
        "may use the reserved nodes (off: they idle while they drain, which on a small cluster with wide "
        "jobs raised avg JCT up to 1.9x)"))
    backfill_margin: float = _knob(2.0, lo=1, doc=(
        "a job backfills only if it would end before the reserved job's predicted start even when it runs this "
        "many times its predicted run time: an underestimate delays the reserved job, an overestimate only "
        "forgoes a backfill"))
    guard_tail: float = _knob(0.0, lo=0, doc=(
        "tail guard: a job waiting this many times the P99 queueing of recently finished jobs is overdue "
        "too (oldest first, with the guard's reservation); 0 turns it off"))
    yield_margin: float = _knob(4.0, lo=0, doc=(
        "yielding: a waiting job takes a node's GPUs from preemptible running jobs whose work left, in GPU-seconds, "
        "is more than this many times its own predicted GPU-time (0: off, Lucid never stops a job)"))
    yield_min_run: float = _knob(10.0, lo=0, doc=(
        "yielding: a job runs at least this many times its checkpoint cost before it may be stopped"))
    yield_max: int = _knob(4, lo=0, doc=(
        "yielding: a job is stopped at most this many times (its queueing tail stays bounded)"))
    yield_interval_s: float = _knob(60.0, lo=0, doc=(
        "yielding: how often running jobs are looked at for stopping (like Tiresias's 60 s rounds)"))
    yield_keep_place: bool = _knob(False, doc=(
        "yielding: a stopped job keeps its place in the queue (its key before it yielded)"))
    yield_wide: bool = _knob(True, doc=(
        "yielding: jobs wider than a node may be stopped too (False: only jobs within one node)"))
    yield_seniority: bool = _knob(True, doc=(
        "yielding by seniority: the oldest waiting long job (see long_quantile) may take the GPUs of long jobs "
        "submitted after it, so the long class runs in arrival order as Tiresias's low queue does"))
    long_quantile: float = _knob(0.95, lo=0, hi=1, doc=(
        "jobs whose predicted GPU-time is above this quantile of recent jobs' form one class served in "
        "arrival order (1: off, pure shortest-first)"))


@dataclass(frozen=True)
class ForecastConfig:
    slot_s: float = _knob(600.0, lo=1, doc="throughput slot length")
    mode_check_interval_s: float = _knob(600.0, lo=1, doc="how often the sharing mode and pool are revisited")


@dataclass(frozen=True)
class TiresiasConfig:
    queue_threshold_gpu_s: float = _knob(18000.0, lo=1, doc=(
        "attained GPU-seconds past which a job is in the low queue (the Lucid artifact's 18,000)"))
    checkpoint_cost_s: float = _knob(40.0, lo=0, hi=86400, doc="run time lost per preemption of a job within one node")
    checkpoint_cost_wide_s: float = _knob(60.0, lo=0, hi=86400, doc="run time lost per preemption of a multi-node job")
    interval_s: float = _knob(60.0, lo=1, hi=86400, doc="scheduling interval: queues are revisited this often")


@dataclass(frozen=True)
class ClusterConfig:
    gpus_per_node: int = _knob(8, lo=1, hi=64)
    gpu_memory_mb: float = _knob(24576.0, lo=1, doc="per-GPU memory (RTX 3090 24 GB in the measured catalog)")


@dataclass(frozen=True)
class UpdateConfig:
    cadence: str = _knob("daily", choices=("never", "daily", "weekly"), doc="how often models refit on new logs")
    drift_mae_ratio: float = _knob(1.25, lo=1, doc="alert when recent error exceeds the reference error by this")
    drift_psi: float = _knob(0.2, lo=0, doc="alert when an input's population stability index exceeds this")
    drift_checks_in_a_row: int = _knob(2, lo=1, doc="the drift alert goes out once this many checks of a model "
                                       "in a row drifted (1: at the first)")


@dataclass(frozen=True)
class RuntimeConfig:
    """The live driver's knobs (the scheduling round), read by `RoundSettings.from_config`."""

    lease_ttl_s: float = _knob(
        0.0, lo=0, hi=86400, doc="a round's lease on the store; a dead round's lapses after this (at most a day: "
        "the lease's MAX_LEASE_TTL_S). 0 (default): derived from "
        "host_call_deadline_s and stop_grace_s, so the lease outlasts any fan-out of host calls (92 s at the defaults)")
    stop_grace_s: float = _knob(10.0, lo=0, doc="seconds between TERM and KILL when a job is stopped")
    launch_grace_s: float = _knob(60.0, lo=1, doc="a launched run whose wrapper has not started by then failed")
    telemetry_interval_s: float = _knob(1.0, lo=0.05, doc="sampling interval of a profiling window")
    monitor_interval_s: float = _knob(5.0, lo=0.05, doc="sampling interval of a running job watched for sharing")
    speed_settle_s: float = _knob(60.0, lo=0, doc="a pair's speed counts from this long after it formed")
    speed_min_samples: int = _knob(10, lo=1, doc="samples needed before a pair's speed is judged")
    max_launch_failures: int = _knob(3, lo=1, doc="a job whose launch hosts refuse this often fails")
    host_cooldown_s: float = _knob(300.0, lo=0, doc="a host that refused a launch gets no new work this long")
    host_lost_after_s: float = _knob(
        600.0, lo=0, doc="a host silent this long loses its runs (their jobs fail, or requeue with requeue_lost); "
        "0 waits for the host forever")
    requeue_lost: bool = _knob(False, doc="put the jobs of a lost host back in the queue instead of failing them")
    idle_probe_s: float = _knob(
        60.0, lo=0, doc="an idle host not heard from this long is probed (draining hosts not; at most "
        "host_parallelism a round), so one that died while idle reads unreachable (and gets no work) before work "
        "is placed there; 0 probes idle hosts only once unreachable")
    unreadable_stop_after_s: float = _knob(
        600.0, lo=0, doc="a run whose status its host answers as garbage this long (its job forged its own "
        "records) is stopped and its job fails, freeing its GPUs; 0 holds it until cancelled")
    keep_ended_runs_days: float = _knob(
        14.0, lo=0, hi=36500, doc="a run's files on its host (logs, telemetry, the job's working directory) are "
        "removed once it has been over this long, so hosts' disks do not fill; 0 keeps them for ever")
    host_parallelism: int = _knob(32, lo=1, doc="hosts a round calls at once (polls, launches, stops, reads)")
    host_call_deadline_s: float = _knob(
        20.0, lo=0.5, doc="one host call's deadline (connecting, retries and the script; a stop adds stop_grace_s): "
        "a silent or slow host costs a round this long at most, once; the lease TTL and the round DAG's task "
        "timeouts are derived from it")


@dataclass(frozen=True)
class LucidConfig:
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    binder: BinderConfig = field(default_factory=BinderConfig)
    orchestrator: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    tiresias: TiresiasConfig = field(default_factory=TiresiasConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if self.binder.medium_threshold > self.binder.tiny_threshold:
            raise ConfigError(
                f"binder.medium_threshold ({self.binder.medium_threshold}) must not exceed "
                f"binder.tiny_threshold ({self.binder.tiny_threshold})"
            )

    def with_overrides(self, overrides: Mapping[str, Any]) -> LucidConfig:
        """A copy with dotted-key overrides applied, e.g. {"profiler.tprof_s": 300}."""
        nested: dict[str, dict[str, Any]] = {}
        for key, value in overrides.items():
            section, _, knob = key.partition(".")
            if not knob:
                raise ConfigError(f"override key {key!r} must look like 'section.knob'")
            nested.setdefault(section, {})[knob] = value
        return _build(nested, base=self)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f.name: {k.name: getattr(getattr(self, f.name), k.name) for k in fields(getattr(self, f.name))}
                for f in fields(self)}


def _shown_value(value: Any) -> str:
    """A refused value for an error message, cut to a readable length (an integer of thousands of digits has
    no repr at all: Python refuses to print one)."""
    try:
        text = repr(value)
    except ValueError:
        return "an integer of thousands of digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _coerce(section: str, knob: str, value: Any, typ: type, meta: Mapping[str, Any]) -> Any:
    where = f"{section}.{knob}"
    try:
        if typ is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                    raise ValueError
                value = low in {"1", "true", "yes", "on"}
            elif not isinstance(value, bool):
                raise ValueError
        elif typ is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            value = int(value)
        elif typ is float:
            if isinstance(value, bool):
                raise ValueError
            value = float(value)
            if not math.isfinite(value):  # NaN, or inf: no knob means "never" by it (0 turns rules off)
                raise ValueError
        elif typ is str and not isinstance(value, str):
            raise ValueError
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer past a float's range
        raise ConfigError(f"{where}: expected {typ.__name__}, got {_shown_value(value)}") from None
    lo, hi, choices = meta.get("lo"), meta.get("hi"), meta.get("choices")
    if lo is not None and value < lo:
        raise ConfigError(f"{where}: {value!r} is below the minimum {lo}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where}: {value!r} is above the maximum {hi}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    return value


def _build(data: Mapping[str, Any], base: LucidConfig | None = None) -> LucidConfig:
    base = base or LucidConfig()
    sections = {f.name: f for f in fields(LucidConfig)}
    updated: dict[str, Any] = {}
    for section, knobs in data.items():
        if section not in sections:
            raise ConfigError(f"unknown config section {section!r}; known: {', '.join(sections)}")
        if not isinstance(knobs, Mapping):
            raise ConfigError(f"config section {section!r} must be a table of knobs, got {knobs!r}")
        current = getattr(base, section)
        hints = get_type_hints(type(current))
        known = {f.name: f for f in fields(current)}
        changes = {}
        for knob, value in knobs.items():
            if knob not in known:
                raise ConfigError(f"unknown knob {section}.{knob}; known: {', '.join(known)}")
            changes[knob] = _coerce(section, knob, value, hints[knob], known[knob].metadata)
        updated[section] = replace(current, **changes)
    return replace(base, **updated)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The table of sections a config file (TOML or YAML) holds, as written there."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} {'is a directory' if p.is_dir() else 'does not exist'}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p} is not UTF-8 text: {exc}") from exc
    try:
        if p.suffix in {".yaml", ".yml"}:
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = tomllib.loads(text)
    except Exception as exc:  # parse errors of either format
        raise ConfigError(f"config file {p} is not valid {p.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {p} must hold a table of sections")
    return dict(data)


def load_config_file(path: str | Path) -> tuple[LucidConfig, set[str]]:
    """Defaults <- the file (no environment), and the 'section.knob' names the file sets."""
    data = read_config_file(path)
    return _build(data), {f"{section}.{knob}" for section, knobs in data.items() if isinstance(knobs, Mapping)
                          for knob in knobs}


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> LucidConfig:
    """Defaults <- file (TOML or YAML) <- environment (LUCID__SECTION__KNOB)."""
    config = _build(read_config_file(path) if path is not None else {})
    env = os.environ if env is None else env
    overrides: dict[str, str] = {}
    for key, value in env.items():
        if key.startswith("LUCID__"):
            parts = key[len("LUCID__"):].lower().split("__")
            if len(parts) != 2:
                raise ConfigError(f"environment variable {key} must look like LUCID__SECTION__KNOB")
            overrides[".".join(parts)] = value
    return config.with_overrides(overrides) if overrides else config


def lucid_home(env: Mapping[str, str] | None = None) -> Path:
    """LUCID_HOME, or ~/.lucid: where the default SQLite store, run logs and the live config file live."""
    env = os.environ if env is None else env
    return Path(env.get("LUCID_HOME") or Path.home() / ".lucid").expanduser()


def live_config_path(env: Mapping[str, str] | None = None) -> Path:
    """The live scheduler's config file: LUCID_CONFIG, else LUCID_HOME/lucid.toml (it need not exist).

    The one place this is decided: the round (CLI and DAG), the pages, the API and the tuner's `apply`
    all read and write this file, so what the tuner applies is what the next round reads.
    """
    env = os.environ if env is None else env
    return Path(env["LUCID_CONFIG"]).expanduser() if env.get("LUCID_CONFIG") else lucid_home(env) / "lucid.toml"


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """`SECTION.KNOB=VALUE` strings (the CLI's --set) as a mapping; ConfigError naming a malformed one."""
    pairs: dict[str, str] = {}
    for item in items:
        knob, sep, value = item.partition("=")
        if not sep or "." not in knob:
            raise ConfigError(f"--set takes SECTION.KNOB=VALUE, got {item!r}")
        pairs[knob.strip()] = value
    return pairs


def knob_takes(typ: type, meta: Mapping[str, Any]) -> str:
    """What a knob accepts, in words: `a number (float) from 1 to 86400`, `true or false`, `one of a, b`."""
    if meta.get("choices"):
        return f"one of {', '.join(meta['choices'])}"
    if typ is bool:
        return "true or false"
    what = {int: "a whole number (int)", float: "a number (float)"}.get(typ, typ.__name__)
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and hi is not None:
        return f"{what} from {lo:g} to {hi:g}"
    if lo is not None:
        return f"{what} >= {lo:g}"
    return f"{what} <= {hi:g}" if hi is not None else what


def check_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Each `SECTION.KNOB=VALUE` of the CLI's --set checked on its own against the schema (the knob exists,
    the value has its type and range), returned converted. ConfigError in one line naming the knob and what it
    takes, or, for an unknown name, the closest known ones and the section's knobs."""
    return {key: check_knob(key, value, f"--set {key}") for key, value in parse_overrides(items).items()}


def check_knob(key: str, value: Any, given: str | None = None) -> Any:
    """One value of the dotted knob `key` checked on its own against the schema, returned converted.

    ConfigError in one line starting with `given` (the flag or field the user wrote; default: the knob),
    saying what the knob takes, or, for an unknown name, the closest known ones and the section's knobs."""
    import difflib

    sections = {f.name: f.default_factory() for f in fields(LucidConfig)}  # type: ignore[misc]
    section, _, knob = key.partition(".")
    given = given or key
    if section not in sections:
        close = difflib.get_close_matches(section, sections, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{given}: unknown section {section!r}{hint}; sections: {', '.join(sections)}")
    known = {f.name: f for f in fields(sections[section])}
    if knob not in known:
        close = difflib.get_close_matches(knob, known, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(f'{section}.{c}' for c in close)}?)" if close else ""
        raise ConfigError(f"{given}: unknown knob{hint}; {section} knobs: {', '.join(known)}")
    typ = get_type_hints(type(sections[section]))[knob]
    try:
        return _coerce(section, knob, value, typ, known[knob].metadata)
    except ConfigError:
        raise ConfigError(f"{given}: expected {knob_takes(typ, known[knob].metadata)}, got {value!r}") from None


def load_live_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                     env: Mapping[str, str] | None = None) -> LucidConfig:
    """The configuration the live scheduler runs with: `path` when given (a --config flag), else the live
    config file when it exists (`live_config_path`), then LUCID__SECTION__KNOB variables, then `overrides`."""
    if path is None:
        default = live_config_path(env)
        path = default if default.is_file() else None
    config = load_config(path, env)
    return config.with_overrides(parse_overrides(overrides)) if overrides else config


def describe_knobs() -> list[tuple[str, Any, str]]:
    """(dotted name, default, doc) for every knob, for docs and the tuner form."""
    rows = []
    for section in fields(LucidConfig):
        for knob in fields(section.default_factory()):  # type: ignore[misc]
            default = knob.default if knob.default is not MISSING else None
            rows.append((f"{section.name}.{knob.name}", default, knob.metadata.get("doc", "")))
    return rows
