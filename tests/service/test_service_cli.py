"""``rollout-server``'s own settings: flags over ``service.<key>=value`` over the run config's
``service.trust_network``; strict booleans; bad CIDRs name where they came from."""

from __future__ import annotations

import argparse

import pytest

from hpc.cli.service import service_config
from hpc.errors import UsageError


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"host": "", "port": None, "no_auth": False, "trust_network": None,
                                 "token_level": None, **kw})


def test_token_level_default_and_flags() -> None:
    assert service_config({}, _args()).token_level is True
    assert service_config({}, _args(token_level=False)).token_level is False
    assert service_config({"token_level": "false"}, _args()).token_level is False
    assert service_config({"token_level": "false"}, _args(token_level=True)).token_level is True
    with pytest.raises(UsageError, match="service.token_level: 'maybe' is not true or false"):
        service_config({"token_level": "maybe"}, _args())


def test_trust_network_precedence_and_errors() -> None:
    run = "192.168.0.0/16"
    assert service_config({}, _args(), run).trust_network == run
    assert service_config({"trust_network": "10.0.0.0/8"}, _args(), run).trust_network == "10.0.0.0/8"
    assert service_config({"trust_network": "10.0.0.0/8"}, _args(trust_network="127.0.0.1/32"), run).trust_network \
        == "127.0.0.1/32"
    for values, args, where in (({}, _args(trust_network="10.0.0.1/8"), "--trust-network"),
                                ({"trust_network": "nope"}, _args(), "service.trust_network"),
                                ({}, _args(), "service.trust_network (run config)")):
        with pytest.raises(UsageError, match="CIDR") as err:
            service_config(values, args, "300.0.0.0/8")
        assert str(err.value).startswith(where)
    assert service_config({}, _args(no_auth=True)).auth is False
