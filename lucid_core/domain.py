"""Records shared by the policy core, the simulator and the live runtime.

Times are seconds (floats) on one clock: trace-relative in the simulator, Unix epoch live.
Nothing here knows a job's true duration: the simulator keeps that to itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class JobState(StrEnum):
    SUBMITTED = "SUBMITTED"
    PROFILING = "PROFILING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
JOB_STATES_BY_VALUE = {state.value: state for state in JobState}  # a dict lookup where rows are many


def left_alone(stored_state: object) -> bool:
    """Whether a round must not move a job whose stored state is this: it ended, or its state is none this
    version knows (another controller's or a hand edit's), so what a move would mean is unknown."""
    state = JOB_STATES_BY_VALUE.get(stored_state) if isinstance(stored_state, str) else None
    return state is None or state in TERMINAL_STATES


class RunState(StrEnum):
    """A run (one job on one host, one attempt) as the store keeps it."""

    PLANNED = "planned"  # decided and recorded, not launched yet
    RUNNING = "running"  # launched: its wrapper runs on the host
    LOST = "lost"  # its host went silent past the limit: reaped once the host answers again
    ENDED = "ended"  # over (exit, stop, lost host reaped, or abandoned before launch)


ACTIVE_RUN_STATES = (RunState.PLANNED, RunState.RUNNING)  # runs that hold GPUs
#: a run profiled in place that ends this soon after its window's end still ended in profiling (live, a round
#: sees the window close a little after it; the simulator on a round cadence, up to a round after it)
PROFILING_END_SLACK_S = 1.0


class ShareClass(IntEnum):
    """Sharing score of a profiled job (paper section 8): the points it uses of a GPU's capacity."""

    TINY = 0
    MEDIUM = 1
    JUMBO = 2


class SharingMode(StrEnum):
    """GPU sharing capacity (GSS) chosen from the load: the forecast or the GPUs queued, whichever is more."""

    OFF = "off"  # exclusive placement only
    APATHETIC = "apathetic"  # GSS 1: only Tiny + (Tiny|Medium)
    DEFAULT = "default"  # GSS 2

    @property
    def capacity(self) -> int:
        return _GSS[self]


_GSS = {SharingMode.OFF: -1, SharingMode.APATHETIC: 1, SharingMode.DEFAULT: 2}  # asked on every partner search


#: the co-located speed (a share of the job's speed alone) a measurement of sharing can give: below the lower
#: bound a pair would never finish; above the upper one it ran faster shared than alone by more than noise (the
#: Lucid artifact's highest is 1.498), which is a wrong solo run (a stalled one makes its pairs look fast, and
#: fast pairs label a configuration Tiny: an unsafe pair would look safe)
MIN_PAIR_SPEED, MAX_PAIR_SPEED = 0.01, 1.5


def pair_speed_problem(*speeds: float) -> str | None:
    """Why a pair's measured co-located speeds are no measurement of sharing (None: they can be, or one is NaN,
    not measured, which readers skip)."""
    if not any(math.isnan(s) for s in speeds) and not all(MIN_PAIR_SPEED <= s <= MAX_PAIR_SPEED for s in speeds):
        shown = " and ".join(f"{s:g}" for s in speeds)
        return (f"co-located speeds {shown} must each be a share of the speed alone between {MIN_PAIR_SPEED:g} "
                f"and {MAX_PAIR_SPEED:g} (0 never finishes, above {MAX_PAIR_SPEED:g} a solo run was wrong)")
    return None

SHARING_MECHANISMS = ("none", "time-slice", "mps")  # how a host's GPUs are shared: never, time slicing, MPS


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.strip().lower()).strip("-")


@dataclass(frozen=True, slots=True)
class SharingKey:
    """What packing labels belong to: a GPU model and the way two jobs share it.

    Labels measured on one key say nothing of another (an RTX 3090's Tiny pair is Jumbo on a
    time-sliced H200), so models are trained, promoted and applied per key."""

    gpu_model: str
    mechanism: str = "time-slice"

    def __post_init__(self) -> None:
        if self.mechanism not in SHARING_MECHANISMS:
            raise ValueError(f"sharing mechanism {self.mechanism!r} is not one of {', '.join(SHARING_MECHANISMS)}")
        if not _slug(self.gpu_model):
            raise ValueError("a sharing key needs a GPU model name")

    @property
    def slug(self) -> str:
        """Stable text of the key, the same for 'NVIDIA H200' and 'nvidia  h200': 'nvidia-h200:mps'."""
        return f"{_slug(self.gpu_model)}:{self.mechanism}"

    @property
    def model_kind(self) -> str:
        """The store's model kind of this key's packing model, e.g. 'packing:nvidia-h200:mps'."""
        return f"packing:{self.slug}"

    def describe(self) -> str:
        return f"{self.gpu_model.strip()} shared by {self.mechanism}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SharingKey) and self.slug == other.slug

    def __hash__(self) -> int:
        return hash(self.slug)

    @classmethod
    def from_kind(cls, kind: str) -> SharingKey | None:
        """The key a model kind names ('packing:<gpu slug>:<mechanism>'), or None for any other kind."""
        parts = kind.split(":")
        if len(parts) != 3 or parts[0] != "packing" or parts[2] not in SHARING_MECHANISMS or not _slug(parts[1]):
            return None
        return cls(parts[1], parts[2])


class Pool(StrEnum):
    MAIN = "main"
    PROFILING = "profiling"


@dataclass(frozen=True, slots=True)
class Profile:
    """Hardware counters sampled during profiling, per GPU of the job.

    gpu_util and mem_util are NVML utilization rates in percent; gpu_mem_mb is the footprint.
    `emulated` is true when the numbers come from a workload catalog rather than a real GPU.
    """

    gpu_util: float
    mem_util: float
    gpu_mem_mb: float
    amp: bool = False
    emulated: bool = False

    def __post_init__(self) -> None:
        for name in ("gpu_util", "mem_util"):
            value = getattr(self, name)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"Profile.{name} must be a percentage in [0, 100], got {value!r}")
        if self.gpu_mem_mb < 0:
            raise ValueError(f"Profile.gpu_mem_mb must be >= 0, got {self.gpu_mem_mb!r}")


@dataclass(slots=True)
class Job:
    """A training job as the scheduler sees it: what was submitted plus what it learned."""

    job_id: str
    user: str
    vc: str
    gpus: int
    submit_time: float
    name: str = ""
    amp: bool = False
    long_cold_start: bool = False
    state: JobState = JobState.SUBMITTED
    profile: Profile | None = None
    share_class: ShareClass | None = None
    predicted_duration: float | None = None
    # lower bound on the duration learned by watching the job, e.g. it outlived its profiling window
    known_min_duration: float = 0.0
    start_time: float | None = None  # start of its (last) main-cluster run
    end_time: float | None = None
    # set when the job may not share a GPU again (its pair turned unstable)
    no_share: bool = False
    preemptible: bool = False  # the job resumes from its own checkpoints, so it may be stopped and restarted
    yields: int = 0  # times it was stopped to let a shorter job run (Lucid's yielding)
    # the longest it may run, all its runs together (live: `--time-limit`; the traces have none): it is stopped
    # there, so no prediction of its duration exceeds it
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("Job.job_id must not be empty")
        if int(self.gpus) != self.gpus or self.gpus < 1:
            raise ValueError(f"Job.gpus must be a positive integer, got {self.gpus!r}")

    @property
    def priority(self) -> float:
        """Lucid's priority value (lower runs first): GPUs x predicted duration."""
        return self.gpus * (self.predicted_duration if self.predicted_duration is not None else 0.0)


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU: its host (node) and index on that host."""

    host: str
    index: int


@dataclass(slots=True)
class Host:
    name: str
    gpus: int = 8
    gpu_memory_mb: float = 24576.0
    vc: str = "default"
    pool: Pool = Pool.MAIN
    address: str = "127.0.0.1"
    port: int = 22
    draining: bool = False
    extra: dict[str, str] = field(default_factory=dict)
