"""The values the scheduler puts into host scripts, checked and quoted before they reach a host shell.

Every value the scheduler adds to a host script (launch, poll, stop, read) is shell-quoted; run ids,
environment variable names and the OS users jobs run as are also checked here, so that none can escape
the work directory or be read as something else by `sh` or `sudo`.
"""

from __future__ import annotations

import re
import shlex

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# POSIX portable user names (portable filename characters, no leading hyphen), at most 32 as useradd allows
OS_USER_PATTERN = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,31}$")


def os_user_problem(name: object) -> str | None:
    """Why `name` cannot be the OS user a job runs as on a host (None when it can)."""
    if not isinstance(name, str) or not OS_USER_PATTERN.match(name):
        return ("must be a POSIX user name to run on hosts that run jobs as their submitter: "
                "1-32 of A-Z a-z 0-9 . _ -, not starting with -")
    if name.isdigit():
        return "must not be all digits (sudo would read it as a uid)"
    if name in {".", ".."}:
        return "must not be . or .."
    if name == "root":
        return "jobs never run as root on hosts that run jobs as their submitter"
    return None


def check_os_user(name: str) -> str:
    """Refuse a user name before it reaches a host shell (see `os_user_problem`)."""
    problem = os_user_problem(name)
    if problem is not None:
        raise ValueError(f"user {name!r} {problem}")
    return name


def check_run_id(run_id: str) -> str:
    """Refuse run ids that could escape the work directory."""
    if not RUN_ID_PATTERN.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {RUN_ID_PATTERN.pattern}")
    return run_id


def quote_path(path: str) -> str:
    """Shell-quote a path, keeping a leading ~/ relative to the remote $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
