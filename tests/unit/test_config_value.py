"""A config is a value: building one asks nothing outside (no registry, no store's client, no
NLTK data folder), it is frozen, and what it derives is derived by the loader as copies."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from helpers.mlflow_server import free_port

from tasks.framework import graph
from tasks.framework.config import ConfigError, RunConfig, config_from_dict, to_dict
from tasks.framework.config_sections import is_setting

ROOT = Path(__file__).resolve().parents[2]


def test_building_a_config_looks_at_no_nltk_data_no_store_and_no_registry(tmp_path, monkeypatch):
    from parsing.nltk_sample import SAMPLE

    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    # NLTK's sample where NLTK looks first: loading does not look (the treebank stage does).
    (tmp_path / "nltk" / SAMPLE).mkdir(parents=True)
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    parsing = config_from_dict({"name": "p", "data": {"source": "treebank", "pair": "words-tree"}})
    assert parsing.parsing.treebank_dir is None
    # A store whose credential variable is unset, behind a closed port: no client is built.
    monkeypatch.delenv("TFM_TEST_UNSET_KEY", raising=False)
    stored = config_from_dict(
        {
            "name": "s",
            "workdir": "s3://bucket/run",
            "storage": {"endpoint": closed, "access_key_env": "TFM_TEST_UNSET_KEY"},
            "mlflow": {"tracking_uri": closed},
        }
    )
    assert stored.workdir == "s3://bucket/run"
    with pytest.raises(ConfigError, match=r"^workdir: .*\$TFM_TEST_UNSET_KEY"):
        _ = stored.store  # the command that opens the work dir meets it
    # A teacher in a registry behind a closed port: its fingerprint waits for its stage.
    distill = config_from_dict(
        {
            "name": "d",
            "distill": {"teacher": "models:/t@champion"},
            "mlflow": {"tracking_uri": closed},
        }
    )
    teacher = graph.spec(distill, "teacher")
    assert teacher.stage_config(distill) == {"name": "t", "version": None, "weights_sha256": None}


def _sections(config: object) -> list[object]:
    """``config`` and every section under it."""
    found = [config]
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            found += _sections(value)
    return found


def test_a_config_and_each_of_its_sections_refuse_assignment():
    config = config_from_dict({"name": "r", "distill": {"teacher": "models:/t/1"}})
    sections = _sections(config)
    assert len(sections) > 15
    for section in sections:
        name = dataclasses.fields(section)[0].name  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, name, getattr(section, name))


def test_what_the_loader_derives_it_derives_as_copies_that_a_replace_keeps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    written = {"name": "r", "workdir": "runs/{name}", "mlflow": {"tracking_uri": "sqlite:///m.db"}}
    config = config_from_dict(written, team_tracking_uri="http://10.0.0.5:5000")
    assert config.workdir == str(tmp_path / "runs" / "r")
    assert config.mlflow.tracking_uri == f"sqlite:///{tmp_path / 'm.db'}"
    assert (config.data.dev, config.data.test) == ("newstest2013", "newstest2014")
    copy = config.replace(seed=5)
    assert (copy.workdir, copy.mlflow, copy.data) == (config.workdir, config.mlflow, config.data)
    assert copy.team_tracking_uri == "http://10.0.0.5:5000"
    ray = config.ray.with_dashboard_port(8300)
    assert (ray.dashboard_port, config.ray.dashboard_port) == (8300, None)  # a copy, not a change
    # Derived values are no settings: never hashed nor logged, and no key a config may write.
    assert "team_tracking_uri" not in to_dict(config)
    assert "dashboard_port" not in to_dict(ray)
    with pytest.raises(ConfigError, match=r"^ray\.dashboard_port: unknown key \(known: address,"):
        config_from_dict({"name": "r", "ray": {"dashboard_port": 8300}})
    with pytest.raises(ConfigError, match=r"^team_tracking_uri: unknown key \(known: name,"):
        config_from_dict({"name": "r", "team_tracking_uri": "http://x"})
    with pytest.raises(ConfigError, match=r"^parent: unknown key \(known: name,"):
        config_from_dict({"name": "r", "parent": {"name": "x"}})  # a fine-tuning's pin
    derived = [f.name for f in dataclasses.fields(RunConfig) if not is_setting(f)]
    assert derived == ["team_tracking_uri", "parent"]


def test_no_config_code_changes_a_frozen_value_in_place():
    """``object.__setattr__`` on a frozen config would make it a value no longer: the config
    modules and the stages that pin a teacher or a parent build copies (``dataclasses.replace``)."""
    pins = [ROOT / "tasks" / "teacher.py", ROOT / "tasks" / "parent.py"]
    files = [*ROOT.glob("tasks/framework/config*.py"), *pins]
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "__setattr__"
        and isinstance(node.value, ast.Name)
        and node.value.id == "object"
    ]
    assert len(files) >= 4 and found == []
