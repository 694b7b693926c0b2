"""``rollout-server``'s settings: run.yaml's ``service:`` section, checked like every other section
(``service.<key>=value`` overrides it), with the flags over it; bad CIDRs name where they came from."""

from __future__ import annotations

import argparse

import pytest

from hpc.cli.service import service_settings
from hpc.config import load_config
from hpc.config.service import ServiceSection
from hpc.errors import ConfigError, UsageError


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"host": "", "port": None, "no_auth": False, "trust_network": None,
                                 "token_level": None, **kw})


def _settings(overrides: list[str], **flags: object) -> ServiceSection:
    return service_settings(load_config(None, overrides).service, _args(**flags))


def test_token_level_default_and_flags() -> None:
    assert _settings([]).token_level is True
    assert _settings([], token_level=False).token_level is False
    assert _settings(["service.token_level=false"]).token_level is False
    assert _settings(["service.token_level=false"], token_level=True).token_level is True
    with pytest.raises(ConfigError, match="service.token_level: expected true or false, got 'maybe'"):
        _settings(["service.token_level=maybe"])


def test_trust_network_precedence_and_errors() -> None:
    run = "192.168.0.0/16"
    assert _settings([f"service.trust_network={run}"]).trust_network == run
    assert _settings([f"service.trust_network={run}"], trust_network="127.0.0.1/32").trust_network == "127.0.0.1/32"
    with pytest.raises(UsageError, match="CIDR") as err:
        _settings([f"service.trust_network={run}"], trust_network="10.0.0.1/8")
    assert str(err.value).startswith("--trust-network")
    with pytest.raises(ConfigError, match="service.trust_network: 'nope' is not a network in CIDR form"):
        _settings(["service.trust_network=nope"])
    assert _settings([], no_auth=True).auth is False and _settings(["service.auth=false"]).auth is False


def test_flags_override_the_section_and_keys_are_strict() -> None:
    cfg = _settings(["service.host=10.1.2.3", "service.port=9000", "service.timeout_s=20"])
    assert (cfg.host, cfg.port, cfg.timeout_s) == ("10.1.2.3", 9000, 20.0)
    cfg = _settings(["service.host=10.1.2.3", "service.port=9000"], host="0.0.0.0", port=0)
    assert (cfg.host, cfg.port) == ("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="service.nope: unknown key; valid keys here: auth, host, llm_server"):
        _settings(["service.nope=1"])
    with pytest.raises(ConfigError, match="service.port: 70000 is above the maximum 65535"):
        _settings(["service.port=70000"])
    with pytest.raises(ConfigError, match="service.max_pending: 0 is below the minimum 1"):
        _settings(["service.max_pending=0"])
