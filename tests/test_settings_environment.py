"""Every setting from the environment (`ENGINE_<NAME>`), as a container is configured
(issue 44; SPEC, "Deployment and tracing"): typed like the TOML file's values, flags
still above them, a value of the wrong type named by its variable."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, environment_settings, load_settings


def test_each_kind_of_setting_comes_from_its_variable(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    for name, value in {"ENGINE_PROCS": "3", "ENGINE_BIND": "0.0.0.0:9090",
                        "ENGINE_LEASE": "90s", "ENGINE_RETRY_SCHEDULE": "5s,1m",
                        "ENGINE_ALLOW_PRIVATE_TARGETS": "true",
                        "ENGINE_DRAIN_DEADLINE_S": "7.5", "ENGINE_API_TOKEN": "t0ken",
                        "ENGINE_PORTAL_FRAME_ANCESTORS": "https://app.example.com",
                        "DATABASE_URL": "postgresql://db/engine"}.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert (settings.procs, settings.bind, settings.lease_ms) == (3, "0.0.0.0:9090", 90_000)
    assert settings.retry_schedule == (5.0, 60.0)
    assert settings.allow_private_targets is True and settings.drain_deadline_s == 7.5
    assert (settings.api_token, settings.dsn) == ("t0ken", "postgresql://db/engine")
    assert settings.portal_frame_ancestors == ("https://app.example.com",)
    # A flag still wins over the environment; ENGINE_DSN over DATABASE_URL.
    assert load_settings(procs=5).procs == 5
    monkeypatch.setenv("ENGINE_DSN", "postgresql://other/engine")
    assert load_settings().dsn == "postgresql://other/engine"


def test_variables_that_are_not_settings_are_left_alone() -> None:
    assert environment_settings({"ENGINE_TEST_DSN": "x", "ENGINE_PROCS": ""}) == {}


@pytest.mark.parametrize(("variable", "value", "mentions"), [
    ("ENGINE_PROCS", "many", "ENGINE_PROCS must be an integer"),
    ("ENGINE_STRICT_EVENT_TYPES", "maybe", "ENGINE_STRICT_EVENT_TYPES must be one of"),
    ("ENGINE_DRAIN_DEADLINE_S", "soon", "ENGINE_DRAIN_DEADLINE_S must be a number"),
    ("ENGINE_PORTAL_FRAME_ANCESTORS", "x;y", "portal_frame_ancestors"),
])
def test_a_bad_value_is_named_by_its_variable(monkeypatch: pytest.MonkeyPatch, variable: str,
                                              value: str, mentions: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=mentions):
        load_settings()
