"""The host's ledger of live runs, which a launch that names its job checks and joins.

A launch that names its job (`claim`) also checks the host's ledger of live runs (`<workdir>/.claims`,
one line per run: job, GPUs, partner; checked and written under `flock` where the host has it): it
refuses a second live run of the same job, and a run on a GPU that a live run of another job holds
unless that job is the partner the store paired it with (prints CONFLICT). An entry counts while its
run's wrapper is alive by the same checks as a poll (`run_records`); the wrapper removes its own as it
ends, and entries of runs found dead are dropped.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from lucid_core.runtime.hosts.inputs import check_run_id

# the word a launch prints (then why) when the host's ledger of live runs refuses it
CONFLICT = "CONFLICT"
CLAIMS = ".claims"  # under the work directory: one file per live run that named its job (LaunchClaim)


@dataclass(frozen=True, slots=True)
class LaunchClaim:
    """What a launch tells the host's ledger of live runs: whose run it is, its GPUs, the job it may share with."""

    job_id: str
    gpu_indices: tuple[int, ...] = ()
    partner: str | None = None  # a job the store paired this one with: a live run of it may hold the same GPUs


def claim_check(run_id: str, claim: LaunchClaim) -> str:
    """sh that refuses (prints CONFLICT, removes the run directory) a launch the ledger of live runs forbids;
    runs with the ledger locked. An entry in the way counts only while its run lives (else it is dropped)."""
    run = shlex.quote(run_id)
    gpus = ",".join(str(i) for i in claim.gpu_indices) or "-"
    return f"""mkdir -p "$W"/{CLAIMS} || {{ echo "ERROR cannot create $W/{CLAIMS}"; drop_run; exit 3; }}
exec 9>> "$W"/{CLAIMS}/.lock
if command -v flock > /dev/null 2>&1 && ! flock -w 30 9; then
  drop_run; echo "{CONFLICT} the host's ledger of live runs stayed locked for 30 s"; exit 6
fi
me={run} job={shlex.quote(claim.job_id)} mine={shlex.quote(gpus)} partner={shlex.quote(claim.partner or "-")}
why=
for c in "$W"/{CLAIMS}/*; do
  [ -f "$c" ] || continue
  o=${{c##*/}}
  [ "$o" = "$me" ] && continue
  cj= cg=
  read -r cj cg cp < "$c" || true
  held=
  if [ "$cj" = "$job" ]; then
    held="job $job already runs on this host as run $o"
  elif [ "$cj" != "$partner" ]; then
    for g in $(printf '%s' "$cg" | tr ',' ' '); do
      case ",$mine," in *",$g,"*) held="GPU $g is held by run $o of job $cj"; break ;; esac
    done
  fi
  [ -n "$held" ] || continue
  # only an entry in the way is checked: a run no longer alive holds nothing (its entry goes)
  if ! setup "$o" || exit_ok "$R" || ! find_wrapper "$R" "$o"; then rm -f "$c"; continue; fi
  why=$held
  break
done
if [ -n "$why" ]; then drop_run; echo "{CONFLICT} $why"; exit 6; fi
"""


def claim_entry(run_id: str, claim: LaunchClaim) -> str:
    """sh that writes the run's entry into the ledger of live runs (once its wrapper has started) and unlocks it."""
    run = shlex.quote(run_id)
    gpus = ",".join(str(i) for i in claim.gpu_indices) or "-"
    return (f"printf '%s %s %s\\n' {shlex.quote(claim.job_id)} {shlex.quote(gpus)} "
            f"{shlex.quote(claim.partner or '-')} > \"$W\"/{CLAIMS}/{run}\n"
            "exec 9>&-")


def conflict_holder(words: Sequence[str]) -> str | None:
    """The run a CONFLICT line names as in the way ("... as run R", "... held by run R of job J"): the last word
    after "run" that is a run id; None when there is none (the host's words are untrusted: nothing else is
    taken for a run)."""
    found = None
    for word, after in itertools.pairwise(words):
        if word == "run":
            try:
                found = check_run_id(after)
            except ValueError:
                continue
    return found
