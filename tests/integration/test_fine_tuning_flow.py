"""Fine-tuning a registered model on the tiny synthetic corpus (``train.init_from``): the whole
flow under Prefect's test harness, with the parent stage in the tokenizer's place; training
starts at the parent's dev loss, not a random model's; the registered version carries its
parent; a model shape that is not the parent's and a parent that does not exist are each one
line. Real Ray, Prefect, MLflow (SQLite) and sentencepiece."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from helpers.flow_configs import ran, tiny_config, write_config

# Slow: a registry, tiny trainings and their decoding. Its budget: 3-4 minutes on 2 busy cores.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(480)]

PARENT = "general"
STAGES = ["parent", "download", "clean", "shard", "train", "average", "translate", "score"]


def register_parent(root: Path, model: Path, tokenizer: Path, bleu: float) -> str:
    """Register ``model`` (an average folder) with ``tokenizer`` as a new version of ``general``
    in the SQLite registry under ``root``, scored ``bleu`` (a higher one takes the champion
    alias); the registry's tracking URI."""
    from tasks.framework.config import config_from_dict
    from tasks.register import register_model

    config = config_from_dict(tiny_config(root, name="parent", **{"register.model_name": PARENT}))
    scores = {"bleu_sacre": bleu, "test_set": "t", "test_variant": "t", "pair": "en-de"}
    scores = {**scores, "signature": "s"}
    tags = {k: str(v) for k, v in scores.items()}
    register_model(config, model / "model.pt", tokenizer, scores, tags)
    return config.tracking_uri


@pytest.fixture(scope="module")
def registry(tmp_path_factory, tiny_model, tiny_tokenizer) -> str:
    """A SQLite registry holding ``tiny_model`` (a debug model trained on a copy task) as
    ``general`` version 1, the champion."""
    return register_parent(tmp_path_factory.mktemp("registry"), tiny_model, tiny_tokenizer, 1.0)


def fine_tuning(workdir: Path, registry: str) -> dict:
    """The tiny flow's config, started from ``general``'s champion with a learning rate too
    small to move it: its first dev loss (after step 1) is the parent's."""
    config = tiny_config(workdir, name="finetune", **{"register.model_name": "finetuned"})
    config["model"] = {"preset": "debug"}  # the parent's shape
    config["tokenizer"]["vocab_size"] = 64  # the parent's tokenizer
    config["train"] = {**config["train"], "init_from": f"models:/{PARENT}@champion"}
    config["train"].update(eval_every=1, lr_scale=1e-6)
    config["mlflow"] = {"tracking_uri": registry, "experiment": "fine-tuning"}
    return config


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, registry, harness, ray_local):
    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.config import load_config

    workdir = tmp_path_factory.mktemp("finetune")
    path = write_config(workdir / "finetune.yaml", fine_tuning(workdir, registry))
    return path, pipeline_flow(config_path=path, loaded=Loaded(load_config(path)))


def dev_loss(config, weights_or_seed: Path | int) -> float:
    """The dev loss of the parent's weights (a checkpoint), or of a random model (a seed), on
    the run's dev shards, computed as the Trainer validates."""
    import torch

    from training.data import TokenData
    from training.validation import Validation
    from transformer_core import checkpoint
    from transformer_core.model import Transformer

    dev = TokenData.read(str(config.root / "shard" / "dev"), 64)
    if isinstance(weights_or_seed, Path):
        module = checkpoint.load_model(weights_or_seed)
    else:
        torch.manual_seed(weights_or_seed)
        module = Transformer(config.model, 64).eval()
    val = Validation(dev, config.train, config.seed, 0, 1, None)
    return val.run(module, torch.device("cpu"), contextlib.nullcontext)["val_loss"]


def test_the_flow_fine_tunes_the_parent_and_registers_it_with_its_lineage(first_run, registry):
    from mlflow import MlflowClient

    from tasks.framework.config import load_config

    path, outcomes = first_run
    assert ran(outcomes) == [*STAGES, "register"]
    stats = {r.stage: r.stats for r in outcomes}
    assert (stats["parent"]["name"], stats["parent"]["version"]) == (PARENT, 1)
    config = load_config(path)
    client = MlflowClient(tracking_uri=registry, registry_uri=registry)
    history = client.get_metric_history(stats["train"]["mlflow_run_id"], "val_loss")
    first = min(history, key=lambda m: m.step)
    parent_loss = dev_loss(config, config.root / "parent" / "model.pt")
    assert first.step == 1 and first.value == pytest.approx(parent_loss, abs=1e-3)
    assert abs(dev_loss(config, config.seed) - parent_loss) > 0.1  # not a random model's

    version = client.get_model_version_by_alias("finetuned", "champion")
    assert version.tags["parent.name"] == PARENT and version.tags["parent.version"] == "1"
    assert version.tags["parent.found_by"] == f"models:/{PARENT}@champion"
    assert version.tags["parent.weights_sha256"] == stats["parent"]["weights_sha256"]


def test_a_model_shape_that_is_not_the_parents_is_one_line(first_run, capsys):
    from pipelines.cli import main

    path, _ = first_run
    code = main(["stage", "train", "--config", path, "--set", "model.d_ff=128"])
    # The stage's log line (it runs: its config changed) precedes the one error line.
    err = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
    assert code == 1 and len(err) == 1, err
    assert err[0] == (
        f"tfm: stage train failed: train.init_from models:/{PARENT}@champion: "
        "model.d_ff 128 != parent's 256"
    )


def test_a_parent_that_does_not_exist_is_one_line_naming_it(first_run, capsys):
    from pipelines.cli import main

    path, _ = first_run
    missing = f"models:/{PARENT}/7"
    code = main(["stage", "parent", "--config", path, "--set", f"train.init_from={missing}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"tfm: stage parent failed: train.init_from {missing}")
    assert "has no version 7" in err[0] and "(its versions: 1)" in err[0]


def test_a_ray_train_checkpoint_is_a_parent_whose_adam_state_the_child_keeps(first_run, tmp_path):
    """A work dir's own checkpoint as the parent (its tokenizer: the parent stage's folder of a
    fine-tuned work dir), Adam's moments kept: the flow runs, the model improves on the data it
    is fine-tuned on, and the version names the folder."""
    from mlflow import MlflowClient

    from pipelines.flows import pipeline_flow
    from tasks.framework.config import load_config

    path, _ = first_run
    first = load_config(path)
    step = sorted((first.root / "train_ray").glob("train-*/step-*"))[-1]
    config = fine_tuning(tmp_path, first.tracking_uri)
    config["name"], config["register"]["model_name"] = "again", "again"
    config["train"].update(init_from=str(step), keep_optimizer=True, lr_scale=1.0)
    again = write_config(tmp_path / "again.yaml", config)
    outcomes = pipeline_flow(config_path=again)
    assert ran(outcomes) == [*STAGES, "register"]
    stats = {r.stage: r.stats for r in outcomes}
    assert stats["parent"]["optimizer"] is True and stats["parent"]["version"] == 0
    client = MlflowClient(tracking_uri=first.tracking_uri, registry_uri=first.tracking_uri)
    version = client.get_model_version_by_alias("again", "champion")
    assert version.tags["parent.name"] == str(step) and version.tags["parent.version"] == "0"
    # at a learning rate that moves it, it learns the new data: its dev loss falls
    history = client.get_metric_history(stats["train"]["mlflow_run_id"], "val_loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert losses[-1] < losses[0] - 0.1, losses


def test_a_new_parent_version_makes_the_parent_stage_and_everything_after_it_stale(
    first_run, registry, tiny_model, tiny_tokenizer
):
    """Last: it moves the alias (a new version of the same weights: the version alone moves)."""
    from tasks.framework.config import load_config
    from tasks.framework.runner import status

    path, _ = first_run
    root = Path(registry.removeprefix("sqlite:///")).parent.parent  # <root>/parent/mlflow.db
    assert register_parent(root, tiny_model, tiny_tokenizer, 2.0) == registry
    rows = dict(status(load_config(path)))
    assert rows["parent"].state == "stale" and "config changed (version)" in rows["parent"].reason
    assert rows["download"].up_to_date and rows["clean"].up_to_date
    assert rows["shard"].reason == "waits for parent" and rows["train"].reason.startswith("waits")
