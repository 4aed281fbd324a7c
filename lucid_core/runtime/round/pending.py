"""Concrete reasons why each waiting job waits, computed from the view after a round decided."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from lucid_core.domain import Job, JobState, ShareClass, SharingMode
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.placement import fleet_could_hold
from lucid_core.policy.view import ClusterView
from lucid_core.units import duration_words, gpu_time_words


def pending_reasons(view: ClusterView, policy: SchedulingPolicy, sharing_reason: str | None = None,
                    leaving: Collection[str] = ()) -> dict[str, tuple[int, str]]:
    """job id -> (position in its queue, 1-based; what keeps it waiting). The words leave out what the
    job's own columns say (its place, its priority): `describe_pending` adds those for readers, so a
    queue that shifts rewrites positions, not tens of thousands of sentences. `leaving`: hosts drained to
    be removed, which no longer count toward what the job's VC can hold."""
    out: dict[str, tuple[int, str]] = {}
    prof_order = sorted(view.profiling_queue, key=lambda j: (view.jobs[j].gpus, view.jobs[j].submit_time, j))
    prof_block = view.profiling.max_free_on_a_node()
    scan_stopped = "waiting for the profiling pool: a smaller job ahead did not fit, the scan stopped there"
    for i, job_id in enumerate(prof_order):
        job = view.jobs[job_id]
        if job.gpus > prof_block:
            why = (f"waiting for the profiling pool: needs {job.gpus} GPU(s) on one node, the largest free "
                   f"block there is {prof_block} ({view.profiling.free_gpus()} of "
                   f"{view.profiling.total_gpus} pool GPUs free)")
        else:
            why = scan_stopped
        out[job_id] = (i + 1, why)
    gpus_per_node = view.config.cluster.gpus_per_node
    # the words depend only on these (a queue holds tens of thousands of jobs)
    # the queue part already names the VC and the width: (part, class, no_share) -> words; the part's VC is
    # the one the scan placed by, so the words speak of the partition the job was actually tried on
    # a job whose own VC has no main host is tried on the untagged hosts (part VC ""): its words name its VC
    middle: dict[tuple[tuple[str, int, int], ShareClass | None, bool, str], str] = {}
    jobs = view.jobs
    merged = [(key, job_id, part) for part, items in view.queue.parts().items() for key, job_id in items]
    merged.sort()
    for i, (_, job_id, part) in enumerate(merged, start=1):
        job = jobs[job_id]
        words_key = (part, job.share_class, job.no_share, "" if part[0] else job.vc)
        words = middle.get(words_key)
        if words is None:
            words = middle[words_key] = _why_waiting(view, job, part[0], gpus_per_node, sharing_reason, leaving)
        out[job_id] = (i, words)
    return out


def pending_text(row: Any) -> str | None:
    """`describe_pending` of a job row (anything with JobRow's columns): what readers show."""
    return describe_pending(row.state, row.queue_position, row.pending_reason, row.gpus, row.predicted_duration)


def describe_pending(state: str, position: int | None, reason: str | None, gpus: int,
                     predicted_duration: float | None) -> str | None:
    """The stored reason in full, for readers: its place in its queue and, in the main queue, its
    priority (a job waiting for profiling is SUBMITTED, one in the main queue QUEUED). The columns are
    read as untrusted (a hand edit can store text in them): a value that is not a number is left out."""
    if not isinstance(reason, str) or not reason or _whole(reason):
        return reason if isinstance(reason, str) else None
    ahead = max(0, position - 1) if type(position) is int else 0
    if state == JobState.SUBMITTED.value:
        return f"{reason}; {ahead} job(s) ahead in least-GPU-first order" if ahead else reason
    parts = [f"behind {ahead} job(s) with a lower priority value"] if ahead else []
    parts.append(reason)
    if isinstance(predicted_duration, float | int) and isinstance(gpus, int):
        parts.append(f"priority {gpu_time_words(gpus * predicted_duration)} ({gpus} x predicted "
                     f"{duration_words(predicted_duration)})")
    return "; ".join(parts)


def _why_waiting(view: ClusterView, job: Job, vc: str, gpus_per_node: int, sharing_reason: str | None,
                 leaving: Collection[str] = ()) -> str:
    """Why a job of this VC, width and sharing class waits, apart from its place and priority."""
    parts = []
    if not view.main.can_fit(job.gpus, vc):
        parts.append(never_fits(view, job.gpus, vc, leaving) or _no_fit_text(view, job.gpus, vc, job.vc))
    mode = view.sharing_mode
    if mode is SharingMode.OFF:
        parts.append(f"sharing is off ({sharing_reason or 'the load forecast says GPUs stay available'})")
    elif job.share_class is None:
        parts.append("not profiled yet, so it may not share a GPU")
    elif job.no_share:
        parts.append("may not share again: its pair turned unstable")
    elif job.share_class is ShareClass.JUMBO and mode is SharingMode.APATHETIC:
        parts.append("Jumbo job and apathetic mode (GSS 1): no partner allowed")
    elif job.gpus > gpus_per_node:
        parts.append("multi-node jobs never share")
    else:
        candidates = len(view.share_candidates.get(job.gpus, {}))
        parts.append(f"no affine partner among {candidates} running {job.gpus}-GPU job(s) that could share")
    return "; ".join(parts)


def never_fits(view: ClusterView, gpus: int, vc: str, leaving: Collection[str] = ()) -> str | None:
    """Why VC `vc`'s main hosts as they are now (those being removed left out; unreachable and draining ones
    kept: they may take work again) could never hold a `gpus`-GPU job, with what would let it run; None when
    they could, or when the VC has no main host (`_no_fit_text` says that). Nothing fails the job: a host may
    be added back."""
    nodes = [n for n in view.main.nodes.values() if n.vc == vc] if vc else []  # untagged: `_no_fit_text`
    kept = [n for n in nodes if n.name not in leaving]
    size = view.main.gpus_per_node
    if not nodes or fleet_could_hold(gpus, [n.gpus for n in kept], size):
        return None
    have = sum(n.gpus for n in kept)
    named = ", ".join(f"{n.name}: {n.gpus}" for n in kept[:6])
    hosts = f" ({named}{', ...' if len(kept) > 6 else ''})" if kept else ""
    wide = f"; a job wider than one host takes whole {size}-GPU hosts" if gpus > size and have >= gpus else ""
    gone = sorted(n.name for n in nodes if n.name in leaving)
    undo = f" or the removal of {', '.join(gone[:4])} undone (lucid hosts drain {gone[0]} --undo)" if gone else ""
    return (f"cannot fit VC {vc} as it is now: it needs {gpus} GPU(s), its main hosts have {have} GPU(s){hosts}{wide}; "
            f"it waits until hosts are added (lucid hosts add ... --vc {vc}){undo}, or cancel it")


def _no_fit_text(view: ClusterView, gpus: int, vc: str, job_vc: str = "") -> str:
    total = view.main.total_gpus_of(vc)
    if view.main.total_gpus == 0:  # the last main host was removed (or none was added)
        return "there is no main host: it waits until one joins (lucid hosts add)"
    if vc and total == 0:
        return f"VC {vc} has no main host: it waits until one joins"
    if not vc and job_vc and total < gpus and total < view.main.total_gpus:
        # hosts carry VCs, none the job's, and the untagged ones cannot hold it: say what would let it run
        return (f"no main host serves VC {job_vc}, and the hosts tagged with no VC have {total} GPU(s): it "
                f"waits until a host with VC {job_vc} (or an untagged one) joins")
    where = f"main node of VC {vc}" if vc else "main node"
    return (f"no compact fit for {gpus} GPU(s): the largest free block on one {where} is "
            f"{view.main.max_free_on_a_node(vc)} ({view.main.free_gpus(vc)} of "
            f"{view.main.total_gpus_of(vc)} GPUs free)")


def _whole(reason: str) -> bool:
    """A reason stored whole, as rounds before `describe_pending` wrote it (until a round rewrites it):
    their words began with the place or ended with the priority or the profiling place, which the words
    stored now never do."""
    return (reason.startswith("behind ") or (reason.endswith(" s)") and "; priority " in reason)
            or reason.endswith(" job(s) ahead in least-GPU-first order"))

