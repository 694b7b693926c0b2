"""The README stays true: its configuration reference is the one generated from the config dataclasses."""

from __future__ import annotations

from pathlib import Path

from hpc.config import RunConfig
from hpc.config.render import reference_markdown

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- CONFIG-REFERENCE:BEGIN -->", "<!-- CONFIG-REFERENCE:END -->"


def test_config_reference_in_sync() -> None:
    text = README.read_text()
    assert BEGIN in text and END in text, "README lost its configuration reference markers"
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert section == reference_markdown(RunConfig).strip(), (
        "README configuration reference is stale: regenerate it with 'spoolrl config default --markdown'")


def test_quick_start_names_the_two_commands() -> None:
    text = README.read_text()
    assert "scripts/demo.sh" in text and "scripts/test.sh" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci
