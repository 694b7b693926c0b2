"""The per-turn token record, the request checks and the trusted-address rule (pure functions, no server)."""

from __future__ import annotations

import pytest

from rollout_node.service.turns import TurnTokens, turns_of
from rollout_node.service.wire import WireError, check_sampling


def test_turns_are_cut_from_one_stream_and_extend_each_other() -> None:
    stream = [1, 2, 3, 10, 11, 4, 5, 20, 21, 22]  # prompt 1 2 3 | gen 10 11 | obs 4 5 | gen 20 21 22
    first, second = turns_of(stream, [(3, [10, 11], [-0.1, -0.2]), (7, [20, 21, 22], [-0.3, -0.4, -0.5])])
    assert first.fields() == {"input_ids": [1, 2, 3], "token_ids": [10, 11], "logprobs": [-0.1, -0.2]}
    assert second.input_ids == (1, 2, 3, 10, 11, 4, 5) and first.extended_by(second)
    assert not second.extended_by(first)


def test_a_generation_missing_from_the_next_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="turn 1"):
        turns_of([1, 2, 3, 10, 99, 4], [(3, [10, 11], [-0.1, -0.2]), (6, [7], [-0.3])])
    with pytest.raises(ValueError, match="1 logprobs for 2"):
        TurnTokens((1,), (2, 3), (-0.1,))


def test_sampling_checks() -> None:
    assert check_sampling(None)["token_level_generation"] is True
    assert check_sampling({}, token_level=False)["token_level_generation"] is False
    assert check_sampling({"token_level_generation": False, "max_output_tokens": 8}) == {
        "token_level_generation": False, "max_output_tokens": 8}
    for bad, word in (({"temperature": 0.0}, "temperature"), ({"top_p": 0.9}, "top_p"),
                      ({"token_level_generation": "yes"}, "token_level_generation"),
                      ({"max_output_tokens": 2.5}, "max_output_tokens")):
        with pytest.raises(WireError, match=word) as err:
            check_sampling(bad)
        assert err.value.status == 400


def test_trusted_addresses() -> None:
    from hpc.config.service import trusted_networks
    from rollout_node.service.app import trusted

    nets = trusted_networks("10.0.0.0/8, fd00::/8")
    assert trusted("10.1.2.3", nets) and trusted("::ffff:10.1.2.3", nets) and trusted("fd00::1", nets)
    assert not trusted("11.0.0.1", nets) and not trusted("::1", nets) and not trusted(None, nets)
    assert not trusted("", nets) and not trusted("10.1.2.3", ())
