"""The live driver's knobs come from the config's runtime section (file, environment), as deployed."""

from __future__ import annotations

import pytest

from lucid_core.config import ConfigError, LucidConfig, load_config
from lucid_core.runtime.round.scheduling_round import RoundSettings


def test_round_settings_follow_the_runtime_section(tmp_path):
    path = tmp_path / "lucid.toml"
    path.write_text("[runtime]\nhost_lost_after_s = 900\nrequeue_lost = true\nstop_grace_s = 30\n", encoding="utf-8")
    config = load_config(path, env={"LUCID__RUNTIME__MAX_LAUNCH_FAILURES": "5"})
    settings = RoundSettings.from_config(config, holder="h")
    assert (settings.host_lost_after_s, settings.requeue_lost, settings.stop_grace_s) == (900, True, 30)
    assert settings.max_launch_failures == 5 and settings.holder == "h"
    assert RoundSettings.from_config(config, stop_grace_s=1.0).stop_grace_s == 1.0  # a CLI flag wins


def test_lost_hosts_are_given_up_by_default_and_zero_waits_forever():
    """A host that never answers again must not hold its jobs forever unless an operator asks for that."""
    assert RoundSettings.from_config(LucidConfig()).host_lost_after_s == 600
    assert RoundSettings().host_lost_after_s == 600  # the dataclass agrees with the config's default
    waiting = LucidConfig().with_overrides({"runtime.host_lost_after_s": 0})
    assert RoundSettings.from_config(waiting).host_lost_after_s is None
    with pytest.raises(ConfigError, match=r"runtime\.host_lost_after_s"):
        LucidConfig().with_overrides({"runtime.host_lost_after_s": -1})


def test_lease_ttl_and_step_timeouts_follow_the_host_call_deadline():
    """A round renews its lease before each fan-out of host calls: by default the lease outlasts the longest
    one (a call's deadline, the stop grace), and a round step's timeout covers its fan-outs."""
    from lucid_core.runtime.round.deadlines import RoundDeadlines

    slow_hosts = LucidConfig().with_overrides({"runtime.host_call_deadline_s": 90, "runtime.stop_grace_s": 10})
    settings = RoundSettings.from_config(slow_hosts)
    deadlines = RoundDeadlines.from_runtime(slow_hosts.runtime)
    assert settings.host_call_deadline_s == 90
    assert settings.lease_ttl_s == deadlines.min_lease_ttl_s > deadlines.fan_out_s > 90 + 10
    assert RoundSettings.from_config(LucidConfig()).lease_ttl_s == 92.0  # 20 s calls, 10 s grace, 2 s, 60 s margin
    assert deadlines.step_timeout_s("reconcile") > deadlines.step_timeout_s("decide")
    assert deadlines.round_timeout_s == sum(deadlines.step_timeout_s(s) for s in ("reconcile", "decide", "carry_out"))
    # a TTL set on purpose is kept (tests of take-overs use a couple of seconds); a CLI flag wins over both
    short = slow_hosts.with_overrides({"runtime.lease_ttl_s": 2})
    assert RoundSettings.from_config(short).lease_ttl_s == 2.0
    assert RoundSettings.from_config(slow_hosts, lease_ttl_s=5.0).lease_ttl_s == 5.0
