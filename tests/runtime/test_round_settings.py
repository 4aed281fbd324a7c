"""The live driver's knobs come from the config's runtime section (file, environment), as deployed."""

from __future__ import annotations

import pytest

from lucid_core.config import ConfigError, LucidConfig, load_config
from lucid_core.runtime.round import RoundSettings


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
