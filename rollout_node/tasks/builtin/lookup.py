"""``builtin-lookup``: a family whose answer is only in a tool observation (``lookup*.jsonl``).

Each instance names a setting of the packaged ``lookup`` repository; its value is in
``settings/<name>.ini`` and in no message. The episode must read that file (a tool call), write the value
into ``VALUE`` in ``lookup/config.py`` (where the instance's test reads it), then submit. The repository,
the tests and the EVAL are as real as for the bug-fix set; only those tests decide the reward.

Guarantees:
- Generated from :data:`SEED` (:func:`settings`): :data:`SETS` names three disjoint sets of instances,
  ``builtin-lookup`` (64, for training), ``builtin-lookup-heldout`` (32, only ever evaluated) and
  ``builtin-lookup-warm`` (32, for any warm start); the setting names and values are random and distinct
  (no name, and no value, occurs in two instances).
- The packaged ``repos/lookup/settings/`` holds exactly the files :func:`setting_files` renders (a test
  checks it): the files of every set are in every checkout, so an instance's file is found by its name only.
- An instance's statement names the setting and its file, never the value; the gold patch writes the value
  into ``lookup/config.py``, and its test checks that value and no other.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from rollout_node.tasks.builtin.spec import Spec, replaced_value

REPO = "lookup"
CONFIG = "lookup/config.py"
PLACEHOLDER = "unset"
TEST_FILE = "tests/test_value.py"
SEED = 34
# tasks.source name -> (file in rollout_node/tasks/builtin/, number of instances); instances are numbered
# in this order, so the sets are disjoint by construction.
SETS = {"builtin-lookup": ("lookup.jsonl", 64), "builtin-lookup-heldout": ("lookup_heldout.jsonl", 32),
        "builtin-lookup-warm": ("lookup_warm.jsonl", 32)}
_FIRST = ("amber", "brisk", "cedar", "dusk", "ember", "frost", "grain", "harbor", "iron", "jade", "kelp", "lunar",
          "maple", "north", "olive", "pine", "quartz", "river", "slate", "tidal")
_SECOND = ("batch", "cache", "delay", "depth", "limit", "offset", "pool", "quota", "ratio", "retry", "scale", "shard",
           "slots", "span", "ttl", "window")
STATEMENT = ("Configure `VALUE` from the `{name}` setting\n\n"
             "`VALUE` in lookup/config.py is still unset. It must hold the value of the setting `{name}`, which "
             "is stored in {path} in this repository (read it there: it is not in this message). "
             "Write that value into `VALUE` in lookup/config.py, then submit.\n")


def settings(seed: int = SEED) -> list[tuple[str, str]]:
    """(name, value) of every instance, in instance order: distinct random names and 4-digit values."""
    rng = random.Random(seed)
    n = sum(count for _, count in SETS.values())
    names = rng.sample([f"{a}_{b}" for a in _FIRST for b in _SECOND], n)
    values = [str(v) for v in rng.sample(range(1000, 10000), n)]
    return list(zip(names, values, strict=True))


def setting_files(seed: int = SEED) -> dict[str, str]:
    """Path in the repository -> text, for every setting file."""
    return {setting_path(name): setting_text(name, value) for name, value in settings(seed)}


def setting_path(name: str) -> str:
    """Where the setting ``name`` is stored in the repository."""
    return f"settings/{name}.ini"


def setting_text(name: str, value: str) -> str:
    """The text of a setting's file."""
    return f"[{name}]\nvalue = {value}\n"


def _test_source(name: str, value: str) -> str:
    return (f"from lookup.config import VALUE\n\n\ndef test_value_is_{name}():\n"
            f"    assert str(VALUE).strip() == \"{value}\"\n")


def lookup_specs(source: str) -> tuple[Spec, ...]:
    """The instances of one set of :data:`SETS` (numbered from 1 across the sets, in their order)."""
    start = 0
    for name, (_, count) in SETS.items():
        if name == source:
            break
        start += count
    else:
        raise KeyError(f"not a builtin-lookup set: {source!r} (one of {', '.join(SETS)})")
    specs = []
    for i, (name, value) in enumerate(settings()[start:start + SETS[source][1]], start=start + 1):
        statement = STATEMENT.format(name=name, path=setting_path(name))
        specs.append(Spec(REPO, i, statement, ((CONFIG, f'"{PLACEHOLDER}"', f'"{value}"'),),
                          ((TEST_FILE, "", _test_source(name, value)),), (f"{TEST_FILE}::test_value_is_{name}",),
                          p2p_files=("tests/test_config.py",)))
    return tuple(specs)


def answer_of(task: Mapping[str, Any] | Any) -> str:
    """The value a task instance asks for (from its gold patch)."""
    patch = task["patch"] if isinstance(task, Mapping) else task.patch
    line = next(x for x in str(patch).splitlines() if x.startswith("+VALUE = "))
    return line.split("=", 1)[1].strip().strip('"')


def setting_of(task: Mapping[str, Any] | Any) -> str:
    """The setting a task instance names (from its FAIL_TO_PASS test's name)."""
    tests = task["FAIL_TO_PASS"] if isinstance(task, Mapping) else task.FAIL_TO_PASS
    return str(tests[0]).rsplit("test_value_is_", 1)[1]


def written_value(arguments: Mapping[str, Any]) -> str | None:
    """The value a ``str_replace`` call writes into ``VALUE``, when it is the family's edit."""
    return replaced_value(arguments, CONFIG, PLACEHOLDER)


def solution_calls(name: str, value: str) -> list[tuple[str, dict[str, Any]]]:
    """The three tool calls of the canonical episode: view the setting's file, write ``value``, submit."""
    return [("view", {"path": setting_path(name)}),
            ("str_replace", {"path": CONFIG, "old": PLACEHOLDER, "new": value}), ("submit", {})]
