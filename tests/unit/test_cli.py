"""The `tfm` command line: help on every command, clear errors, status without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.cli import build_parser, main

COMMANDS = ["version", "run", "stage", "status", "translate", "deploy", "ui"]


def test_every_command_has_help(capsys):
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([command, "--help"])
        assert exit_.value.code == 0
        assert "usage: tfm " + command in capsys.readouterr().out


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("tfm ")


def _config(tmp_path: Path, **extra) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "cli", "workdir": str(tmp_path / "{name}"), **extra}))
    return str(path)


def test_status_of_a_fresh_config_says_missing_and_why(tmp_path, capsys):
    assert main(["status", _config(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["download", "missing"]
    assert "waits for download" in lines[2]
    assert [line.split()[0] for line in lines[1:]] == [
        "download", "clean", "tokenizer", "shard", "train", "average", "translate", "score", "register"
    ]


def test_status_of_a_parsing_config_lists_the_parsing_stages(tmp_path, capsys):
    assert main(["status", _config(tmp_path, data={"source": "treebank", "pair": "words-tree"})]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert names[:2] == ["treebank", "linearize"] and names[-1] == "parse_score"


def test_config_errors_exit_2_with_the_key_path(tmp_path, capsys):
    code = main(["status", _config(tmp_path), "--set", "model.n_heads=7"])
    assert code == 2
    assert "model.n_heads: 7 does not divide d_model 512" in capsys.readouterr().err
    assert main(["status", _config(tmp_path), "--set", "nonsense"]) == 2


def test_unknown_stage_and_missing_inputs_exit_1(tmp_path, capsys):
    assert main(["stage", "polish", "--config", _config(tmp_path)]) == 1
    assert "unknown stage 'polish'" in capsys.readouterr().err
    assert main(["stage", "clean", "--config", _config(tmp_path)]) == 1
    assert "input 'download' is missing" in capsys.readouterr().err


def test_ui_prints_loopback_commands(tmp_path, capsys):
    assert main(["ui", _config(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--host 127.0.0.1" in out and "mlflow ui" in out and "prefect server start" in out
