"""``builtin-pick``: the learnable built-in family (``tasks.source: builtin-pick``, ``pick.jsonl``).

Each instance asks for one setting of the packaged ``summary`` repository: ``AGGREGATE`` in
``summary/config.py`` must name the aggregate that the problem statement asks for, one of
:data:`VALUES` (K = 4). The repository, its tests and the EVAL are as real as for the bug-fix set
(``tasks.source: builtin``): a git mirror, a test patch that adds the FAIL_TO_PASS test, the
tamper-proof harness in a sandbox. Only those tests decide the reward.

What makes it learnable by a tiny model in minutes (and still a test of the whole loop):
- The correct edit depends on the statement only through the value, which the statement names in
  backticks (a token of its own in the tiny tokenizer; :func:`single_token_values` checks it).
- One canonical solution of two short turns (:func:`solution_calls`): a ``str_replace`` whose last
  argument is the value (a single token after a fixed prefix), then ``submit``.
- Every statement ends with the same request naming the value, then insists on it :data:`REPEATS`
  times ("It must be `min`."); four openings phrase the rest differently and name the value once or
  twice more. With the demo's one-line system prompt 10-11 of the 165-188 prompt tokens are the value:
  that share, not wording about the value, is what lets the tiny model read the statement from RL at
  all; the demo's batch shape, forward KL and KL-bounded lr do the rest (docs/pick_learning.md).
A policy that ignores the statement scores 1/K in expectation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout_node.tasks.builtin.spec import Spec, replaced_value

REPO = "summary"
CONFIG = "summary/config.py"
PLACEHOLDER = "unset"
VALUES = ("min", "max", "first", "last")
TEST_FILE = "tests/test_aggregate.py"
# summarize([3, 9, 2, 6]) under each aggregate: four distinct answers, so a test tells them apart.
SAMPLE = (3, 9, 2, 6)
EXPECTED = {"min": 2, "max": 9, "first": 3, "last": 6}
# Each statement ends with the same request and insistence, so the value sits at fixed distances from the
# end of the prompt (where a small model can learn to look); the openings differ and mention the value again.
CLOSING = "Set `AGGREGATE` in summary/config.py to `{v}`."
REPEATS = 8
INSISTENCE = " It must be `{v}`." * REPEATS
PHRASINGS = tuple(opening + CLOSING + INSISTENCE + "\n" for opening in (
    "summarize() must report the `{v}`\n\n"
    "`summarize(values)` raises ValueError because the aggregate is still unset; it should be the `{v}`. ",
    "Reports need the `{v}` aggregate\n\nOur dashboards call `summarize()` and expect the `{v}` of each list. ",
    "Use the `{v}` in summaries\n\nPlease make summarize() return the `{v}` of its input. ",
    "summarize() is not configured\n\n"
    "Calling `summarize([3, 9, 2, 6])` fails with `unknown aggregate 'unset'`. The team agreed on `{v}`. ",
))


def _test_source(value: str) -> str:
    return (f"from summary import summarize\n\n\ndef test_summarize_reports_the_{value}():\n"
            f"    assert summarize({list(SAMPLE)}) == {EXPECTED[value]}\n"
            f"    assert summarize([5]) == 5\n")


def pick_specs() -> tuple[Spec, ...]:
    """Every instance: the phrasings x K values, numbered from 1 with the values in turn (1 ``min``, 2 ``max``,
    ...), so K consecutive instances ask for every value once (``tasks.order: file`` balances each step)."""
    specs = []
    for j, phrasing in enumerate(PHRASINGS):
        for i, value in enumerate(VALUES):
            specs.append(Spec(
                REPO, 1 + j * len(VALUES) + i, phrasing.format(v=value),
                ((CONFIG, f'"{PLACEHOLDER}"', f'"{value}"'),),
                ((TEST_FILE, "", _test_source(value)),),
                (f"{TEST_FILE}::test_summarize_reports_the_{value}",), p2p_files=("tests/test_report.py",)))
    return tuple(specs)


def answer_of(task: Mapping[str, Any] | Any) -> str:
    """The value a task instance asks for (from its FAIL_TO_PASS test id)."""
    tests = task["FAIL_TO_PASS"] if isinstance(task, Mapping) else task.FAIL_TO_PASS
    name = str(tests[0]).rsplit("_", 1)[-1]
    assert name in VALUES, f"not a builtin-pick instance: {tests}"
    return name


def solution_calls(value: str) -> list[tuple[str, dict[str, Any]]]:
    """The two tool calls of the canonical episode that writes ``value`` (any value, right or wrong)."""
    return [("str_replace", {"path": CONFIG, "old": PLACEHOLDER, "new": value}), ("submit", {})]


def written_value(arguments: Mapping[str, Any]) -> str | None:
    """The value a ``str_replace`` call writes into the setting, when it is the family's edit."""
    return replaced_value(arguments, CONFIG, PLACEHOLDER)


def single_token_values(encode: Any) -> bool:
    """Whether every value is one token both as a JSON string argument and in backticks (``encode``: text -> ids)."""
    for value in VALUES:
        in_call, in_text = encode(f'"new": "{value}"}}'), encode(f"the `{value}` of")
        if len(in_call) != len(encode('"new": "x"}')) or len(in_text) != len(encode("the `x` of")):
            return False
    return True
