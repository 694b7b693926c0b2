"""The command line as a user meets it (issue 38): overrides anywhere with the verb's own usage on
errors, nothing created before the checks, ``validate`` refusing what would fail after the queue
wait, one wording for a directory that is no run and a file that is no shard, help without markup.

Each test runs ``hpc.cli.main`` (what the ``spoolrl`` script calls) and checks its exit status and
message; the launch tests put a real ``sbatch`` stand-in (a shell script: the local Slurm is not
what they test) first on PATH, or none at all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from hpc.cli import build_parser, main

CPU = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``spoolrl ARGS``; argparse's exits included."""
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """An HF model directory as far as the checks look (config.json; no template = ChatML)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def config_file(tmp_path: Path, model_dir: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": str(model_dir)}, "trainer": {"precision": "fp32"},
                                    "slurm": {"train": {"gpus_per_node": 0}}}))
    return path


# ---------------------------------------------------------------- 1. overrides anywhere

def test_overrides_go_before_or_after_the_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(capsys, "validate", "trainer.lr=1e-5", "--config", str(config_file), "trainer.lr=2e-5")
    assert rc == 0 and "valid" in out, err
    rc, out, err = cli(capsys, "init", "NEW", "--config", str(config_file), "trainer.lr=2e-5")
    assert rc == 0, err
    frozen = yaml.safe_load((tmp_path / "NEW" / "run.yaml").read_text())["config"]
    assert frozen["trainer"]["lr"] == 2e-5
    rc, out, err = cli(capsys, "resume", "NEW", "--dry-run", "slurm.rollout.nodes=3")
    assert rc == 0, err
    assert "--nodes=3" in out.split("#SBATCH --partition=cpu", 1)[1].split("\n#SBATCH --signal", 1)[0]
    rc, out, err = cli(capsys, "render", "trainer.lr=3e-5", "--config", str(config_file), "--run", "R",
                       "-o", "job.sbatch", "slurm.rollout.nodes=2")
    assert rc == 0, err
    assert "--nodes=2" in (tmp_path / "job.sbatch").read_text()


@pytest.mark.parametrize("args, verb", [(["init", "NEW", "--bogus"], "init"),
                                        (["validate", "k=v", "--nope"], "validate"),
                                        (["resume", "RUN", "--dry-run", "--what"], "resume"),
                                        (["spool", "stats", "RUN", "--extra"], "spool stats")])
def test_a_usage_error_prints_the_verbs_own_usage(capsys: pytest.CaptureFixture[str], args: list[str],
                                                  verb: str) -> None:
    rc, _, err = cli(capsys, *args)
    assert rc == 2 and f"usage: spoolrl {verb} " in err and "unrecognized arguments" in err, err
    assert "usage: spoolrl [-h]" not in err


# ---------------------------------------------------------------- 5. nothing created before the checks

def _sbatch(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sbatch"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def test_launch_checks_sbatch_first_and_a_failed_submission_can_be_retried(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, config_file: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, bin_dir = tmp_path / "NEW", tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no sbatch at all
    launch = ["launch", "--config", str(config_file), "--run", str(run)]
    rc, _, err = cli(capsys, *launch)
    assert rc == 1 and "sbatch not found on PATH" in err and "nothing was created" in err, err
    assert not run.exists()
    _sbatch(bin_dir, "echo 'sbatch: error: invalid partition specified: gpu' >&2; exit 1")
    rc, _, err = cli(capsys, *launch)
    assert rc == 1 and "invalid partition" in err, err
    assert (run / "run.yaml").exists()  # created, then sbatch refused: nothing was submitted
    _sbatch(bin_dir, "echo 4242")
    rc, out, err = cli(capsys, *launch)
    assert rc == 0 and "submitted job 4242" in out, err  # the retry is not refused
    rc, _, err = cli(capsys, *launch)
    assert rc == 2 and "already holds a run" in err  # once a job was submitted, it is a run to resume


def test_rollout_server_checks_its_paths_before_creating_its_run(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    run = tmp_path / "raas"
    rc, _, err = cli(capsys, "rollout-server", "--run", str(run), "--port", "0", "model.path=/nowhere/model",
                     "tasks.source=/nowhere/tasks.jsonl")
    assert rc == 2 and "model.path: /nowhere/model does not exist here" in err and "tasks.source" in err, err
    assert not run.exists()


# ---------------------------------------------------------------- 6. validate catches what fails after the wait

CASES = {
    "task set typo": (["tasks.source=builtin_pick"], "tasks.source: 'builtin_pick' is neither a built-in set",
                      "did you mean 'builtin-pick'?"),
    "missing task file": (["tasks.source=/nowhere/tasks.jsonl"], "tasks.source: /nowhere/tasks.jsonl does not "
                          "exist here", "--paths-on-cluster"),
    "empty model path": (["model.path="], "model.path: empty", "'tiny'"),
    "missing interpreters": (["slurm.rollout.python=/nowhere/bin/python", "inference.engine=vllm",
                              "inference.vllm_python=/nowhere/vllm/bin/python"],
                             "slurm.rollout.python: /nowhere/bin/python does not exist here",
                             "inference.vllm_python: /nowhere/vllm/bin/python does not exist here"),
    "missing model": (["model.path=/nowhere/model"], "model.path: /nowhere/model does not exist here",
                      "--paths-on-cluster"),
    "a step that never fills": (["trainer.max_tasks_outstanding=1", "algorithm.groups_per_step=4"],
                                "trainer.max_tasks_outstanding: 1 is below algorithm.groups_per_step (4)",
                                "wait forever"),
    "a second --gres": (["slurm.train.sbatch_extra=[--gres=gpu:4]"], "slurm.train.sbatch_extra[0]: '--gres=gpu:4' "
                        "repeats --gres", "set slurm.train.gpus_per_node instead"),
    "a second --mem": (["slurm.rollout.sbatch_extra=['--account=a', '--mem-per-cpu=4G']"],
                       "slurm.rollout.sbatch_extra[1]", "set slurm.rollout.mem_gb instead"),
    "no rollout nodes": (["slurm.rollout.nodes=0"], "slurm.rollout.nodes: 0 renders a job without rollout nodes",
                         "set it to 1 or more"),
    "a newline typed in an override": (["slurm.job_name=x\necho INJECTED"], "slurm.job_name: 'x\\necho INJECTED' "
                                       "contains the control character '\\n'", "one line of plain text"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_refuses_what_would_fail_after_the_queue_wait(capsys: pytest.CaptureFixture[str], case: str,
                                                               model_dir: Path) -> None:
    overrides, problem, fix = CASES[case]
    rc, out, err = cli(capsys, "validate", *CPU, f"model.path={model_dir}", *overrides)
    assert rc == 2 and problem in err and fix in err, err
    assert "valid" not in out


def test_the_file_and_the_command_line_refuse_a_newline_alike(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path, model_dir: Path) -> None:
    cfg = tmp_path / "nl.yaml"
    cfg.write_text(yaml.safe_dump({"slurm": {"job_name": "x\necho INJECTED"}}))
    from_file = cli(capsys, "validate", "--config", str(cfg), *CPU, f"model.path={model_dir}")[2]
    typed = cli(capsys, "validate", *CPU, f"model.path={model_dir}", "slurm.job_name=x\necho INJECTED")[2]
    assert from_file == typed and "control character" in typed


def test_init_refuses_an_empty_model_and_never_records_a_hash_of_nothing(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = cli(capsys, "init", str(tmp_path / "a"), *CPU, "model.path=")
    assert rc == 2 and "model.path: empty" in err and not (tmp_path / "a").exists()
    rc, _, err = cli(capsys, "init", str(tmp_path / "b"), *CPU, "model.path=/on/the/cluster", "--paths-on-cluster")
    assert rc == 0 and "not checked here (--paths-on-cluster): model.path=/on/the/cluster" in err, err
    provenance = yaml.safe_load((tmp_path / "b" / "run.yaml").read_text())["provenance"]
    assert provenance["model_hash"] is None and provenance["tokenizer_hash"] is None


# ---------------------------------------------------------------- 11. polish

def _parsers(parser: argparse.ArgumentParser, name: str = "spoolrl") -> dict[str, argparse.ArgumentParser]:
    out = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                out.update(_parsers(sub, f"{name} {verb}"))
    return out


def test_help_has_descriptions_and_no_markup() -> None:
    parsers = _parsers(build_parser())
    for name in ("spoolrl status", "spoolrl cancel", "spoolrl sandbox exec"):
        assert parsers[name].description, f"{name} has no description"
    for name, parser in parsers.items():
        text = parser.format_help()
        assert "``" not in text and ":class:`" not in text and ":mod:`" not in text, name
    verbs = build_parser().format_help().split("<command>\n", 1)[1].split()
    assert verbs[0] == "demo"


NOT_A_RUN = [["status", "D"], ["status", "D", "--json"], ["cancel", "D"], ["resume", "D"],
             ["scale", "D", "--rollout-nodes", "1"], ["spool", "stats", "D"], ["spool", "inspect", "D"],
             ["checkpoints", "D"], ["train-node", "D"], ["rollout-node", "D"], ["infer-node", "D"]]


def test_one_wording_for_a_directory_that_is_no_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "D").mkdir()
    wording = f"{tmp_path / 'D'} is not a spoolrl run directory (no run.yaml); create one with 'spoolrl init"
    for args in NOT_A_RUN:
        rc, _, err = cli(capsys, *args)
        assert rc == 2 and wording in err, (args, rc, err)
    assert list((tmp_path / "D").iterdir()) == []


def test_a_file_that_is_no_shard_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for name, data in (("short.shard", b"hi\n"), ("text.shard", json.dumps({"a": 1}).encode() * 40)):
        (tmp_path / name).write_bytes(data)
        rc, _, err = cli(capsys, "spool", "inspect", str(tmp_path / name))
        assert rc == 2 and f"{tmp_path / name} is not a valid spoolrl shard (" in err, err
