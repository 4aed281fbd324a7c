"""Who may read a job's output (the stdout and stderr of its runs): its own user and operators.

Training logs carry tokens, keys and paths, so the surfaces that know the caller (the HTTP API and the Airflow
plugin's pages, through `request.state.lucid_user` / `lucid_operator`) show them to nobody else. A surface
without identity (the API served on its own, without auth) shows them to whoever may reach it, as before.
"""

from __future__ import annotations


def may_read_output(owner: str, user: str | None, operator: bool) -> bool:
    """Whether the caller `user` may read the output of a job of `owner`: the same person or an operator; anyone
    where the surface has no identity (`user` None)."""
    return user is None or operator or user == owner


def output_rule(job_id: str, owner: str) -> str:
    """The rule, said to a caller refused a job's output: whose output it is and who may read it."""
    return f"the output of job {job_id} (its stdout and stderr) is {owner}'s: only {owner} and operators may read it"
