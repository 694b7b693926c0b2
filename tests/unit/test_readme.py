"""The README stays true: its configuration reference is the one generated from the config dataclasses,
every ``spoolrl`` command it (and docs/inference.md) shows parses, every ``scripts/...`` command it shows
names a script that defines its flags, its shell blocks run in their checkable form (validate, render,
launch --dry-run), and the shipped example configs validate."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc.cli import build_parser, main
from hpc.config import RunConfig, load_config
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


# ---------------------------------------------------------------- the README's commands run as written

DOCS = [README, README.parent / "docs" / "inference.md"]
PLACEHOLDERS = {"N": "2", "S": "0", "T": "0.7", "P": "0", "R": "bwrap", "F": "run.yaml"}


def _inline_commands(text: str) -> list[str]:
    """Every inline code span that is a spoolrl command (spans may wrap over lines)."""
    return [" ".join(m.split()) for m in re.findall(r"`(spoolrl [^`]*)`", text)]


def _concrete(span: str) -> list[str] | None:
    """A usage line as one concrete argv: optional parts taken, the first alternative, placeholders
    filled; None for an abbreviation ('...' standing for arguments) or a generic '<command>'."""
    words = shlex.split(span.replace("\\|", "|").replace("[", " ").replace("]", " ").split(" > ")[0])[1:]
    words = [w for w in words if w != "..."] if "k=v" in words else words
    if "..." in words or "<command>" in words:
        return None
    return [PLACEHOLDERS.get(w.split("|")[0], w.split("|")[0]) for w in words]


def _verb_depth(argv: list[str]) -> int:
    """How many leading words of argv name a (sub)command."""
    parser, depth = build_parser(), 0
    while depth < len(argv):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or argv[depth] not in subs[0].choices:
            break
        parser, depth = subs[0].choices[argv[depth]], depth + 1
    return depth


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_inline_command_parses(doc: Path) -> None:
    checked = 0
    for span in _inline_commands(doc.read_text()):
        argv = _concrete(span)
        if argv is None or argv == ["--help"]:
            continue
        depth = _verb_depth(argv)
        assert depth >= 1, f"{doc.name}: {span!r} names no spoolrl command"
        if depth == len(argv):  # a command named in prose ('spoolrl report'): the name is what can be wrong
            continue
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{doc.name}: {span!r} does not parse (exit {exc.code})")
        overrides = [o for o in getattr(args, "overrides", []) if "=" in o and o != "k=v"]
        if argv[0] != "rollout-server" and overrides:  # the keys and values it shows exist (DIR stands for a path)
            load_config(None, overrides)
        checked += 1
    assert checked >= (20 if doc == README else 1)


SCRIPT = re.compile(r"(scripts/\w+\.(?:py|sh))(.*)", flags=re.S)


def _script_spans(text: str) -> list[tuple[str, str]]:
    """(script, what follows it) of every inline code span and indented code line naming ``scripts/NAME.py|sh``
    (fenced blocks left out: the test below checks their lines)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = re.findall(r"`([^`]*)`", text) + re.findall(r"^ {4}(.*scripts/.*)$", text, flags=re.M)
    return [(m.group(1), m.group(2)) for span in spans if (m := SCRIPT.search(span))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_script_command_names_a_script_that_takes_its_flags(doc: Path) -> None:
    """An inline ``scripts/NAME ARGS`` span: the script exists and defines every ``--flag`` the span shows."""
    spans = _script_spans(doc.read_text())
    for script, args in spans:
        path = README.parent / script
        assert path.is_file(), f"{doc.name}: {script} does not exist"
        text = path.read_text()
        unknown = [f for f in re.findall(r"--[a-z][\w-]*", args) if not re.search(re.escape(f) + r"(?![\w-])", text)]
        assert not unknown, f"{doc.name}: {script}{args} shows flags {script} does not define: {unknown}"
    assert spans


CLUSTER_FS = "/shared/"  # the README's shared filesystem


def _fenced_shell_lines(text: str) -> list[str]:
    blocks = re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _command(line: str) -> list[str]:
    """A shell line's command words: up to its first redirection or pipe."""
    argv = shlex.split(line, comments=True)
    cut = [i for i, word in enumerate(argv) if word in (">", ">>", "|", "2>", "&&")]
    return argv[:cut[0]] if cut else argv


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


def test_the_fenced_commands_run_in_their_checkable_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Each README shell line: a script exists; ``cp`` copies from the repository; ``validate`` and
    ``render`` run (paths named as on the cluster), ``launch`` as ``--dry-run``; other verbs parse.
    A ``/shared/...`` argument (the cluster's filesystem: ``render`` creates ``RUN/logs/`` there) is taken
    under ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in _fenced_shell_lines(README.read_text()):
        argv = [str(tmp_path) + w if w.startswith(CLUSTER_FS) else w for w in _command(line)]
        if argv[0] == "cp":
            shutil.copy(README.parent / argv[1], tmp_path / argv[2])
        elif argv[0] != "spoolrl":
            assert (README.parent / argv[0]).is_file(), line
        elif argv[1] in ("validate", "render", "launch"):
            extra = ["--paths-on-cluster"] + (["--dry-run"] if argv[1] == "launch" and "--dry-run" not in argv else [])
            rc, err = _run([*argv[1:], *extra], capsys)
            assert rc == 0, f"README: {line!r} failed ({rc}): {err}"
            ran.append(argv[1])
        else:
            build_parser().parse_args(argv[1:])
    assert {"validate", "render", "launch"} <= set(ran)
    script = (tmp_path / "job.sbatch").read_text()
    assert (tmp_path / "shared" / "runs" / "qwen3-8b" / "logs").is_dir()  # render made the job's log directory
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "#SBATCH --gres=gpu:8" in script and "--mem=491520M" in script  # what the walk-through says


@pytest.mark.parametrize("example", sorted((README.parent / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_validate_with_their_cluster_paths(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(["validate", "--config", str(example), "--paths-on-cluster"], capsys)
    assert rc == 0, err
    assert "not checked here (--paths-on-cluster): model.path=/shared/models/" in err
    config = load_config(example)
    assert config.inference.engine == "vllm" and config.sandbox.runtime == "apptainer"
    assert config.slurm.train.gpus_per_node >= 1 and config.slurm.time_limit_min >= 120
