"""The one stage driver (``tasks.framework.runner.run_pipeline``) that ``tfm run``'s flows and
``tfm import fairseq`` go through: which stages it reruns, and its MLflow parent run."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.flow_configs import WMT14_STAGES

from tasks.framework.config import config_from_dict
from tasks.framework.graph import StageSpec
from tasks.framework.results import StageResult
from tasks.framework.runner import run_pipeline

pytestmark = pytest.mark.integration


def drive(tmp_path: Path, ran: set[str], **how) -> tuple[dict[str, bool | str], str]:
    """The pipeline driven with stages that 'run' when named in ``ran`` or forced; what each
    stage was told (its force) and the parent run's MLflow id."""
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = config_from_dict(
        {"name": "driven", "workdir": str(tmp_path / "work"), "mlflow": {"tracking_uri": tracking}}
    )
    told: dict[str, bool | str] = {}

    def run_one(stage: StageSpec, rerun: bool | str, parent: str) -> StageResult:
        told[stage.name] = rerun
        runs = stage.name in ran or bool(rerun)
        return StageResult(stage.name, tmp_path / stage.name, runs, str(rerun), {}, 0.0)

    results, parent = run_pipeline(config, run_one, **how)
    assert [r.stage for r in results] == [s for s in WMT14_STAGES if s in told]
    return told, parent


def test_a_stage_that_ran_reruns_the_stages_after_it(tmp_path: Path):
    from mlflow import MlflowClient

    told, parent = drive(tmp_path, {"shard"}, force=("average",))
    assert told["clean"] is False and told["shard"] is False  # shard ran on its own
    assert told["train"] == "upstream shard ran" and told["average"] is True  # forced
    assert told["translate"] == "upstream average ran"
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tags = MlflowClient(tracking).get_run(parent).data.tags
    assert tags["pipeline"] == "wmt14"
    assert tags["stages.ran"].split(",") == WMT14_STAGES[WMT14_STAGES.index("shard") :]


def test_without_following_upstream_each_stage_is_told_only_its_own_force(tmp_path: Path):
    told, _ = drive(tmp_path, {"shard"}, force=("average",), follow_upstream=False)
    assert told["train"] is False and told["average"] is True and told["translate"] is False


def test_only_runs_the_stages_named(tmp_path: Path):
    told, _ = drive(tmp_path, {"shard"}, only=("shard", "train"))
    assert told == {"shard": False, "train": "upstream shard ran"}
