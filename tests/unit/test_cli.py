"""The `tfm` command line: help on every command, clear errors, status without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.flow_configs import WMT14_STAGES

from pipelines.cli import build_parser, main
from pipelines.commands import mlflow_ui_hint
from pipelines.environment import started

COMMANDS = ["version", "run", "stage", "status", "tracking", "translate", "export", "deploy", "ui"]


def test_every_command_has_help(capsys):
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([command, "--help"])
        assert exit_.value.code == 0
        assert "usage: tfm " + command in capsys.readouterr().out


def test_a_first_run_waits_for_prefect_to_create_its_database(tmp_path, monkeypatch):
    """Prefect gives its ephemeral server 20 s, about what a fresh PREFECT_HOME's migrations take
    on 2 cores (CI's first `tfm run` of a test failed so). tfm's longer wait reaches Prefect's
    settings under the variable's real name, and a value the user set wins."""
    from prefect.settings import Settings

    monkeypatch.chdir(tmp_path)
    for key in (
        "PREFECT_HOME",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
        "PREFECT_LOGGING_LEVEL",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
    ):
        monkeypatch.setenv(key, "")  # recorded, so the test's end takes back what tfm sets
        monkeypatch.delenv(key)
    assert Settings().server.ephemeral.startup_timeout_seconds == 20  # Prefect's own
    with started(verbose=False):
        assert Settings().server.ephemeral.startup_timeout_seconds >= 120
    assert Settings().server.ephemeral.startup_timeout_seconds == 20  # as it was, after
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "45")
    with started(verbose=False):
        assert Settings().server.ephemeral.startup_timeout_seconds == 45


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
    assert [line.split()[0] for line in lines[1:]] == WMT14_STAGES


def test_status_of_a_parsing_config_lists_the_parsing_stages(tmp_path, capsys):
    assert (
        main(["status", _config(tmp_path, data={"source": "treebank", "pair": "words-tree"})]) == 0
    )
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert names[:2] == ["treebank", "linearize"] and names[-1] == "parse_score"


def test_config_errors_exit_2_with_the_key_path(tmp_path, capsys):
    code = main(["status", _config(tmp_path), "--set", "model.n_heads=7"])
    assert code == 2
    assert "model.n_heads: 7 does not divide d_model 512" in capsys.readouterr().err
    assert main(["status", _config(tmp_path), "--set", "nonsense"]) == 2


def test_an_old_numerics_key_stops_run_and_status_in_the_line_naming_its_replacement(
    tmp_path, capsys
):
    config = _config(tmp_path, train={"cpu_bf16": True})
    for command in ("run", "status"):
        assert main([command, config]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            "tfm: config error: train.cpu_bf16: replaced by train.precision (bf16 on a CPU: "
            f"precision: bf16) (in {config})"
        )
    assert not (tmp_path / "cli").exists()  # nothing started


def test_a_store_that_cannot_work_stops_the_commands_in_one_line_before_anything_starts(
    tmp_path, capsys
):
    """Loading builds no store client; the commands that use the work dir open it first."""
    bad = ["--set", "workdir=s3://AKIAX:hunter22@bucket/run"]
    bad += ["--set", "mlflow.tracking_uri=http://127.0.0.1:5000"]
    for command in ("run", "status", "deploy"):
        assert main([command, _config(tmp_path), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tfm: config error: workdir: s3://bucket/run: the URI holds")
        assert "\n" not in err and "hunter22" not in err


def test_unknown_stage_and_missing_inputs_exit_1(tmp_path, capsys):
    assert main(["stage", "polish", "--config", _config(tmp_path)]) == 1
    assert "unknown stage 'polish'" in capsys.readouterr().err
    assert main(["stage", "clean", "--config", _config(tmp_path)]) == 1
    assert "input 'download' is missing" in capsys.readouterr().err


def test_ui_prints_loopback_commands(tmp_path, capsys):
    assert main(["ui", _config(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--host 127.0.0.1" in out and "mlflow ui" in out and "prefect server start" in out


@pytest.mark.parametrize(
    ("uri", "hint"),
    [
        # A tracking server serves the UI itself: its address, without the credentials.
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://alice:s3cret@mlflow.example.org/team", "https://mlflow.example.org/team"),
        ("http://token@10.0.0.5:8080", "http://10.0.0.5:8080"),
    ],
)
def test_the_ui_hint_for_a_tracking_server_is_its_address(uri, hint):
    assert mlflow_ui_hint(uri) == hint


def test_the_ui_hint_for_a_store_is_the_command_that_serves_it():
    hint = mlflow_ui_hint("sqlite:////tmp/run/mlflow.db")
    assert hint.endswith(
        " -m mlflow ui --backend-store-uri sqlite:////tmp/run/mlflow.db --host 127.0.0.1"
    )
    hint = mlflow_ui_hint("postgresql://bob:pw9@db:5432/mlflow")
    assert "--backend-store-uri postgresql://bob:***@db:5432/mlflow" in hint and "pw9" not in hint


def test_any_failure_is_one_line_naming_the_stage_and_v_shows_the_traceback(tmp_path, capsys):
    from tasks.framework.runner import build_folder

    config = _config(tmp_path)
    # A finished train folder whose checkpoint listing is not JSON: not an error written for
    # users, so its type is named, and the traceback waits for -v.
    build_folder(
        "train",
        tmp_path / "cli" / "train",
        {"t": 1},
        {},
        lambda tmp: (tmp / "checkpoints.json").write_text("{not json") and {},
    )
    assert main(["stage", "average", "--config", config]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    ours = [line for line in err.splitlines() if line.startswith("tfm:")]
    assert len(ours) == 1, err
    assert ours[0].startswith("tfm: stage average failed: JSONDecodeError: ")
    assert ours[0].endswith("(run with -v for the traceback)")
    with pytest.raises(ValueError, match="Expecting property name"):
        main(["-v", "stage", "average", "--config", config])


def test_status_verify_checks_every_files_sha256(tmp_path, capsys):
    from tasks.framework.config import load_config
    from tasks.framework.runner import run_stage

    path = _config(tmp_path, data={"source": "synthetic", "synthetic_train": 25000})
    out = run_stage(load_config(path), "download", {}).path
    big = out / "train" / "synthetic.en"
    assert big.stat().st_size > (1 << 20)  # checked by size unless --verify
    data = bytearray(big.read_bytes())
    data[100] ^= 1  # same size, one bit off
    big.write_bytes(bytes(data))
    assert main(["status", path]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["download", "up"]
    assert main(["status", path, "--verify"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[:2] == ["download", "stale"] and "train/synthetic.en differs" in row
