"""Trajectories decoded as conversations: roles, texts and trained/context marks recovered exactly from token IDs
(ChatML and Llama-3), and ``spool inspect --decode`` on a shard and on a run's latest shards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpc.cli import main
from hpc.decode import conversation, render_text
from hpc.spool import Spool
from tests.unit import chat_fixture as cf

EXPECTED = [("system", cf.SYSTEM), ("task", cf.TASK), ("assistant", cf.CALL), ("observation", cf.OBSERVATION),
            ("assistant", cf.SUBMIT)]


@pytest.mark.parametrize("fmt, specials", [("chatml", cf.CHATML), ("llama3", cf.LLAMA3)])
def test_messages_roles_texts_and_marks_come_back_exactly(fmt: str, specials: tuple[str, ...]) -> None:
    tok = cf.tokenizer(specials)
    b = cf.episode(tok, fmt)
    msgs = conversation(tok, b.ids, b.mask)
    assert [(m.role, m.text) for m in msgs] == EXPECTED
    # the observation's literal "<|im_end|>" is text (encoded as plain tokens), so it did not end the message
    assert "<|im_end|>" in msgs[3].text
    for m in msgs:
        want = len(m.text) if m.role == "assistant" else 0
        assert m.trained_chars == want, (m.role, [(p.text, p.trained) for p in m.pieces])
    assert [m.closed for m in msgs] == [True, True, True, True, False]  # the last turn was cut off


def test_plain_and_colour_rendering_mark_context_only() -> None:
    tok = cf.tokenizer()
    b = cf.episode(tok)
    msgs = conversation(tok, b.ids, b.mask)
    plain = render_text(msgs, color=False)
    assert f"[task]\n[ctx]{cf.TASK}[/ctx]" in plain
    assert f"[assistant 1]\n{cf.CALL}\n[observation 1]\n[ctx]{cf.OBSERVATION}[/ctx]" in plain
    assert "[assistant 2] (no end of turn)" in plain
    color = render_text(msgs, color=True)
    assert "[ctx]" not in color and f"\x1b[2m{cf.TASK}\x1b[0m" in color and f"\n{cf.CALL}\n" in color


def _run(tmp_path: Path) -> tuple[Path, list[Path]]:
    run = tmp_path / "run"
    model = cf.write_model_dir(tmp_path / "model")
    run.mkdir()
    (run / "run.yaml").write_text(f"config:\n  model:\n    path: {model}\n    tokenizer_path: ''\n")
    tok = cf.tokenizer()
    spool = Spool(run)
    shards = []
    for i, reward in enumerate((0.0, 1.0)):
        writer = spool.writer(f"w{i}")
        writer.add_group([cf.trajectory(cf.episode(tok), f"task-{i}", reward)])
        shards.append(writer.flush())
        time.sleep(0.002)  # shard ids start with the sealing time in ms
    return run, sorted((run / "spool" / "shards" / "ready").glob("*.shard"))


def test_inspect_decode_on_a_shard_and_on_the_latest_shards_of_a_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, shards = _run(tmp_path)
    assert main(["spool", "inspect", str(shards[0]), "--decode"]) == 0
    out = capsys.readouterr().out
    assert "=== task-0:s0:a0" in out and f"[assistant 1]\n{cf.CALL}\n" in out and f"[ctx]{cf.TASK}[/ctx]" in out
    assert "[outcome] status=ok  reward=0  stop=submit  tests 0/4 passed  diff 120 bytes, applied" in out
    assert main(["spool", "inspect", str(run), "--latest", "1", "--decode"]) == 0
    out = capsys.readouterr().out
    assert "=== task-1:s0:a0" in out and "task-0" not in out
    assert main(["spool", "inspect", str(run), "--latest", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("shard ") == 2 and "[task]" not in out


def test_inspect_decode_without_a_tokenizer_says_how_to_give_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, shards = _run(tmp_path)
    (tmp_path / "model" / "tokenizer.json").unlink()
    assert main(["spool", "inspect", str(shards[0]), "--decode"]) != 0
    assert "--tokenizer DIR" in capsys.readouterr().err
    cf.write_model_dir(tmp_path / "other")
    assert main(["spool", "inspect", str(shards[0]), "--decode", "--tokenizer", str(tmp_path / "other")]) == 0
