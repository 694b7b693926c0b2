"""docs/faults.md and the fault table in rollout_node/pipeline/faults.py say the same thing."""

from __future__ import annotations

from pathlib import Path

from hpc.trajectory import Status
from rollout_node.pipeline.faults import OUTCOMES, table_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "faults.md"


def doc_rows() -> list[tuple[str, ...]]:
    text = DOC.read_text()
    block = text.split("<!-- fault-table:begin -->")[1].split("<!-- fault-table:end -->")[0]
    lines = [ln for ln in block.strip().splitlines()[2:] if ln.startswith("|")]
    return [tuple(c.strip() for c in ln.strip("|").split("|")) for ln in lines]


def test_doc_table_equals_module_table() -> None:
    module = [tuple(c.replace("``", "`") for c in row) for row in table_rows()]
    assert doc_rows() == module


def test_table_statuses_match_the_outcomes_used_by_the_node() -> None:
    rows = {row[0]: row for row in table_rows()}
    for fault, outcome in OUTCOMES.items():
        if outcome.status.infrastructure or outcome.status == Status.CANCELLED:
            assert not outcome.status.trainable, fault
    final = {row[2] for row in rows.values()}
    for outcome in OUTCOMES.values():
        assert outcome.status.value in final, f"{outcome.status.value} is not in the documented table"
    excluded = [r for r in rows.values() if r[3] == "excluded"]
    assert all(not Status(r[2]).trainable for r in excluded)
