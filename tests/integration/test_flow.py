"""The whole WMT14 flow on a tiny synthetic config, under Prefect's test harness.

One module-scoped first run, then reruns that check skipping, and (slow: each retrains)
``--force``, a deleted artifact folder and a failing stage. Real Ray, real Prefect, real MLflow
(SQLite), real sentencepiece.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.flow_configs import MIRROR, SECRET, WMT14_STAGES, ran, tiny_config, write_config

from pipelines import environment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, harness, ray_local):
    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.config import load_config

    workdir = tmp_path_factory.mktemp("flow")
    path = write_config(workdir / "tiny.yaml", tiny_config(workdir))
    # As `tfm run` calls it: the config it loaded, and the path that names it; the later runs
    # pass the path alone, as a deployment does.
    outcomes = pipeline_flow(config_path=path, loaded=Loaded(load_config(path)))
    return workdir, path, outcomes


def test_every_stage_runs_and_mlflow_holds_parent_child_runs_and_a_champion(first_run):
    from mlflow import MlflowClient

    from tasks.framework.config import load_config

    workdir, path, outcomes = first_run
    assert [r.stage for r in outcomes] == WMT14_STAGES
    assert ran(outcomes) == WMT14_STAGES
    config = load_config(path)
    for name in WMT14_STAGES:
        assert (config.root / name / "manifest.json").is_file(), name

    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    parents = [r for r in runs if r.data.tags.get("pipeline") == "wmt14"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["prefect.flow_run_id"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.data.tags["stage"] for r in children) == sorted(WMT14_STAGES)
    train_child = next(r for r in children if r.data.tags["stage"] == "train")
    assert train_child.data.tags.get("fingerprint")
    shard_child = next(r for r in children if r.data.tags["stage"] == "shard")
    logged = {a.path for a in client.list_artifacts(shard_child.info.run_id, "shard")}
    assert {"shard/manifest.json", "shard/lengths.png"} <= logged
    # Each stage's stats reach its child run once; training keeps its own curves.
    score_child = next(r for r in children if r.data.tags["stage"] == "score")
    scores = next(r for r in outcomes if r.stage == "score").stats
    assert score_child.data.metrics["bleu_sacre"] == scores["bleu_sacre"]
    assert score_child.data.tags["skipped"] == "false"
    val_loss = client.get_metric_history(train_child.info.run_id, "val_loss")
    assert sorted(m.step for m in val_loss) == [3, 6]
    champion = client.get_model_version_by_alias("flowtest", "champion")
    assert str(champion.version) == "1"


def test_the_flow_run_shows_its_stages_and_scores_as_a_prefect_artifact(first_run):
    from prefect import get_client

    from pipelines.flows import artifact_key

    # Through the REST API: Prefect 3.8.8's client sends filter bodies its server refuses.
    body = {
        "artifacts": {"key": {"any_": [artifact_key("flowtest")]}},
        "sort": "UPDATED_DESC",
        "limit": 1,
        "offset": 0,
    }
    with get_client(sync_client=True) as client:
        response = client._client.post("/artifacts/filter", json=body)
    response.raise_for_status()
    [artifact] = response.json()
    assert artifact["type"] == "markdown"
    table = artifact["data"]
    for stage in WMT14_STAGES:
        assert f"| {stage} | ran |" in table
    assert "| bleu_sacre |" in table and "MLflow parent run" in table


def test_a_uri_password_reaches_no_manifest_param_tag_or_prefect_record(first_run):
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.logging.handlers import APILogHandler

    from pipelines.flows import artifact_key
    from tasks.framework.config import load_config

    _, path, _ = first_run
    config = load_config(path)
    masked = MIRROR.replace(SECRET, "***")
    for name in WMT14_STAGES:
        assert SECRET not in (config.root / name / "manifest.json").read_text(), name
    # Nor any file of the work dir: stage folders (train's config.json), MLflow's database and
    # artifacts, the tracking journals.
    holding = [
        str(f) for f in config.root.rglob("*") if f.is_file() and SECRET.encode() in f.read_bytes()
    ]
    assert holding == []
    assert (
        json.loads((config.root / "download" / "manifest.json").read_text())["config"]["mirror"]
        == masked
    )

    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    for run in runs:
        assert SECRET not in repr(run.data.params) and SECRET not in repr(run.data.tags), (
            run.info.run_name
        )
    # The parent run's params hold the config, the URL masked; the training's hold what training
    # reads (model, train, seed), not the whole config a second time.
    train = next(r for r in runs if r.data.tags.get("stage") == "train")
    parent = next(r for r in runs if r.data.tags.get("pipeline") == "wmt14")
    assert parent.data.params["data.mirror"] == masked and "data.mirror" not in train.data.params
    assert train.data.params["model.d_model"] == parent.data.params["model.d_model"]
    version = client.get_model_version("flowtest", "1")
    assert json.loads(version.tags["config"])["data"]["mirror"] == masked

    APILogHandler().flush()  # the flow's logs reach the API in the background
    with get_client(sync_client=True) as prefect:
        found = prefect._client.post(
            "/artifacts/filter",
            json={
                "artifacts": {"key": {"any_": [artifact_key("flowtest")]}},
                "limit": 5,
                "offset": 0,
            },
        )
        logs = prefect._client.post("/logs/filter", json={"limit": 200, "offset": 0})
        flow_runs = prefect._client.post(
            "/flow_runs/filter",
            json={
                "flow_runs": {"id": {"any_": [parent.data.tags["prefect.flow_run_id"]]}},
                "limit": 5,
                "offset": 0,
            },
        )
    # The flow run's recorded parameters name the config; the loaded config's values stay out.
    [recorded] = flow_runs.json()
    assert recorded["parameters"]["loaded"] == "<Loaded>" and SECRET not in json.dumps(recorded)
    assert found.json() and all(SECRET not in a["data"] for a in found.json())
    assert logs.json() and all(SECRET not in entry["message"] for entry in logs.json())


def test_second_run_skips_every_stage(first_run):
    from pipelines.flows import pipeline_flow

    _, path, _ = first_run
    before = {name: os.environ.get(name) for name in environment.COMMAND_VARIABLES}
    outcomes = pipeline_flow(config_path=path)
    assert ran(outcomes) == []
    # A flow that loaded its own config set Ray's and MLflow's switches for its run only: a Ray
    # started later in this process must not be told where the State API of this one was.
    assert {name: os.environ.get(name) for name in before} == before


def test_status_reports_every_stage_up_to_date(first_run):
    from tasks.framework import runner
    from tasks.framework.config import load_config

    _, path, _ = first_run
    rows = runner.status(load_config(path))
    assert [name for name, _ in rows] == WMT14_STAGES
    assert all(st.up_to_date for _, st in rows), rows


def test_a_test_set_added_after_training_runs_the_evaluate_stage_alone(first_run, tmp_path):
    """A second, shifted test set (another seed's synthetic test split, as local files) added to
    the trained config, not held out: the flow runs evaluate alone, which scores both sets and
    logs each set's figures on its MLflow run, and register, which keeps them on a new version
    that the evidence does not promote (the champion's own weights)."""
    from mlflow import MlflowClient

    from corpora.synthetic import write_corpus
    from pipelines.flows import pipeline_flow
    from tasks.framework.config import load_config

    workdir, _, _ = first_run
    write_corpus(tmp_path, pair="en-de", seed=99, train=1, dev=1, test=12)
    shifted = {"name": "shifted", "prefix": str(tmp_path / "test"), "holdout": False}
    sets = [{"name": "synthetic"}, shifted]
    path = write_config(workdir / "sets.yaml", tiny_config(workdir, **{"eval.test_sets": sets}))
    outcomes = pipeline_flow(config_path=path)
    assert ran(outcomes) == ["evaluate", "register"]
    assert next(r for r in outcomes if r.stage == "evaluate").stats["translated"] == "shifted"

    config = load_config(path)
    table = json.loads((config.root / "evaluate" / "scores.json").read_text())["sets"]
    score = json.loads((config.root / "score" / "scores.json").read_text())
    assert [r["test_set"] for r in table] == ["synthetic", "shifted"]
    assert table[0]["bleu_sacre"] == score["bleu_sacre"] and table[1]["test_segments"] == 12
    client = MlflowClient(tracking_uri=config.tracking_uri)
    experiment = client.get_experiment_by_name(config.mlflow.experiment)
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'evaluate'")
    for row in table:
        assert run.data.metrics[f"bleu_sacre/{row['test_set']}"] == row["bleu_sacre"]
        assert run.data.metrics[f"chrf/{row['test_set']}"] == row["chrf"]
    registered = json.loads((config.root / "register" / "registered.json").read_text())
    assert registered["version"] == 2 and registered["aliases"] == ["candidate"]
    assert registered["decision"].startswith("bleu_sacre on synthetic +0.00 [+0.00, +0.00], p")
    assert "the champion has no hypotheses on: shifted" in registered["decision"]
    tags = client.get_model_version("flowtest", "2").tags
    for row in table:
        assert tags[f"eval.{row['test_set']}.bleu_sacre"] == f"{row['bleu_sacre']:.4f}"


@pytest.mark.slow  # the benchmark's decoder on the flow's model: ~10 s
def test_decode_dev_with_the_configs_settings_on_test_gives_the_score_stages_figure(
    first_run, tmp_path
):
    """benchmarks/decode_dev.py (one process, the translator in a loop) agrees with the pipeline
    (Ray Data's translate actors, then the score stage) on the test split; on dev it sweeps."""
    import subprocess
    import sys

    from tasks.framework.config import load_config

    _, path, _ = first_run
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_dev.py"
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(script), path, "--split", "test", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    config = load_config(path)
    scores = json.loads((config.root / "score" / "scores.json").read_text())
    assert (row["beam"], row["alpha"], row["config's"]) == (2, config.decode.alpha, "*")
    assert row["segments"] == scores["test_segments"]
    assert row["bleu_tok_lc"] == round(scores["bleu_tok_lc"], 2)
    assert row["bleu_sacre"] == round(scores["bleu_sacre"], 2)

    done = subprocess.run(
        [
            sys.executable,
            str(script),
            path,
            "--beams",
            "1,2",
            "--alphas",
            "0.6,1.0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["split"], r["beam"], r["alpha"]) for r in rows] == [
        ("dev", 1, 0.6),
        ("dev", 1, 1.0),
        ("dev", 2, 0.6),
        ("dev", 2, 1.0),
    ]
    assert all(r["segments"] == 30 for r in rows)

    missing = tmp_path / "nothing.pt"
    done = subprocess.run(
        [sys.executable, str(script), path, "--model", str(missing)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip() == f"decode_dev: {missing} does not exist (run `tfm run {path}` first)"
    )


@pytest.mark.slow  # a rerun of train .. register: ~25 s
def test_force_shard_reruns_shard_and_everything_after_it(first_run):
    from pipelines.flows import pipeline_flow

    _, path, _ = first_run
    outcomes = pipeline_flow(config_path=path, force=["shard"])
    assert ran(outcomes) == WMT14_STAGES[WMT14_STAGES.index("shard") :]
    # Only shard was forced; the others say what made them run.
    reasons = {r.stage: r.reason for r in outcomes if r.ran}
    assert reasons["shard"] == "forced"
    assert reasons["train"] == "upstream shard ran" and reasons["average"] == "upstream train ran"


@pytest.mark.slow  # a rerun of train .. register: ~25 s
def test_deleted_tokenizer_folder_reruns_tokenizer_and_after(first_run):
    from pipelines.flows import pipeline_flow
    from tasks.framework import runner
    from tasks.framework.config import load_config

    _, path, _ = first_run
    config = load_config(path)
    shutil.rmtree(config.root / "tokenizer")
    status = dict(runner.status(config))
    assert status["tokenizer"].state == "missing"
    assert status["clean"].up_to_date and not status["shard"].up_to_date
    outcomes = pipeline_flow(config_path=path)
    assert ran(outcomes) == WMT14_STAGES[WMT14_STAGES.index("tokenizer") :]


@pytest.mark.slow  # a rerun of train .. register: ~25 s
def test_failing_stage_stops_the_flow_and_a_fixed_rerun_continues_there(first_run):
    from pipelines.flows import pipeline_flow

    workdir, path, _ = first_run
    bad = write_config(
        workdir / "bad.yaml",
        tiny_config(
            workdir, **{"train.steps": 8, "average.last": 50, "average.spacing": "sideways"}
        ),
    )
    from tasks.framework.config import ConfigError

    with pytest.raises(ConfigError, match="average.spacing"):
        pipeline_flow(config_path=bad)
    # A value that passes validation but makes one stage fail: training on a missing GPU.
    bad = write_config(
        workdir / "bad.yaml", tiny_config(workdir, **{"train.steps": 8, "train.use_gpu": True})
    )
    with pytest.raises(Exception, match="GPU"):
        pipeline_flow(config_path=bad)
    good = write_config(workdir / "bad.yaml", tiny_config(workdir, **{"train.steps": 8}))
    outcomes = pipeline_flow(config_path=good)
    assert ran(outcomes) == WMT14_STAGES[WMT14_STAGES.index("train") :]


def test_deploy_registers_a_scheduled_deployment_and_a_stage_deployment(tmp_path, harness):
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from pipelines.deploy import deploy
    from tasks.framework.config import load_config

    path = write_config(tmp_path / "tiny.yaml", tiny_config(tmp_path))
    config = load_config(path)

    async def create_pool():
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name="transformer-test", type="process"))

    asyncio.run(create_pool())
    flow_id = deploy(Path(path), config, cron="0 3 * * 1", work_pool="transformer-test")
    stage_id = deploy(
        Path(path), config, cron=None, work_pool="transformer-test", stage="translate",
        overrides={"decode.beam_size": 2},  # tfm deploy --set decode.beam_size=2
    )  # fmt: skip

    async def read(deployment_id):
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    flow_dep = asyncio.run(read(flow_id))
    assert flow_dep.entrypoint == "pipelines/flows.py:pipeline_flow"
    assert flow_dep.parameters == {"config_path": path}
    assert [s.schedule.cron for s in flow_dep.schedules] == ["0 3 * * 1"]
    stage_dep = asyncio.run(read(stage_id))
    assert stage_dep.entrypoint == "pipelines/flows.py:stage_flow"
    assert stage_dep.parameters["stage"] == "translate" and stage_dep.parameters["force"] is True
    assert stage_dep.parameters["overrides"] == {"decode.beam_size": 2}


def test_a_download_that_fails_for_good_is_not_retried(tmp_path, harness):
    """A file missing from the mirror fails the same way every time: the flow gives up after one
    try of the download stage instead of three (the retries are for a network that stayed down)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    from pipelines.flows import pipeline_flow

    empty = tmp_path / "mirror"
    empty.mkdir()
    config = {
        "name": "noretry",
        "workdir": str(tmp_path / "run"),
        "data": {"source": "multi30k", "pair": "en-de", "mirror": empty.as_uri()},
    }
    state = pipeline_flow(config_path=write_config(tmp_path / "m.yaml", config), return_state=True)
    assert state.is_failed()
    assert "no such file" in str(state.result(raise_on_failure=False))
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            ),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=50,
        )
    download = [r for r in runs if r.task_key.startswith("stage") and r.name.startswith("download")]
    assert [r.run_count for r in download] == [1]
