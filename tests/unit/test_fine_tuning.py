"""Fine-tuning's config and start (``train.init_from``, ``train.freeze``): the keys' checks, a
config without them fingerprinted as before they existed, the parent stage in place of the
tokenizer's, a new parent version that makes training stale, a model shape that is not the
parent's refused in one line, and the parent's weights loaded with the frozen parts kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tasks import parent
from tasks.framework import graph
from tasks.framework.config import ConfigError, config_from_dict, flatten, to_dict
from tasks.framework.config_sections import TeacherPin
from tasks.framework.results import StageError
from tasks.framework.stage_fingerprint import stage_fingerprint
from training.config import TrainConfig
from training.parent_weights import keep_parent_moments, shape_mismatch, start_from_parent
from transformer_core import checkpoint, presets
from transformer_core.model import Transformer
from transformer_core.schedule import make_optimizer, make_scheduler

PARENT = "models:/general@champion"


def config(tmp_path: Path, **train):
    return config_from_dict(
        {
            "name": "ft",
            "workdir": str(tmp_path / "ft"),
            "model": {"preset": "debug"},
            "train": train,
        }
    )


def pinned(cfg, version: int, sha: str = "a" * 64):
    return cfg.replace(parent=TeacherPin("general", version, sha, "run", PARENT))


def test_a_config_without_the_keys_has_the_plain_form_and_stages_it_had(tmp_path):
    plain = config(tmp_path, steps=10)
    # The plain form (what stage fingerprints hash) is the one before the keys existed: every
    # other setting of the section, and not these.
    new = {"init_from", "freeze", "keep_optimizer"}
    older = {f.name for f in dataclasses.fields(TrainConfig)} - new
    assert set(to_dict(plain.train)) == older
    assert "train.init_from" not in flatten(plain) and "train.freeze" not in flatten(plain)
    names = [s.name for s in graph.pipeline(plain)]
    assert names[:4] == ["download", "clean", "tokenizer", "shard"] and "parent" not in names


def test_set_keys_are_in_the_train_stage_fingerprint(tmp_path):
    plain, tuned = config(tmp_path), config(tmp_path, init_from=PARENT, freeze=["encoder"])
    assert to_dict(tuned.train)["init_from"] == PARENT
    assert to_dict(tuned.train)["freeze"] == ["encoder"]
    train = graph.spec(plain, "train")
    assert train.stage_config(plain) != train.stage_config(tuned)


def test_the_parent_stage_stands_in_for_the_tokenizer(tmp_path):
    tuned = config(tmp_path, init_from=PARENT)
    stages = {s.name: s.inputs for s in graph.pipeline(tuned)}
    assert list(stages)[0] == "parent" and "tokenizer" not in stages
    for stage in ("shard", "train", "translate", "register"):
        assert stages[stage]["tokenizer"] == "parent", stage


def test_a_new_parent_version_makes_the_parent_stage_and_so_training_stale(tmp_path):
    tuned = config(tmp_path, init_from=PARENT)
    spec = graph.spec(tuned, "parent")
    first, same, second = pinned(tuned, 1), pinned(tuned, 1), pinned(tuned, 2)
    fp = [stage_fingerprint("parent", spec.stage_config(c), {}) for c in (first, same, second)]
    assert fp[0] == fp[1] != fp[2]
    other_weights = pinned(tuned, 1, sha="b" * 64)
    assert stage_fingerprint("parent", spec.stage_config(other_weights), {}) != fp[0]
    # The train stage reads the parent's folder as its tokenizer: its input fingerprint moves.
    assert graph.spec(tuned, "train").inputs["tokenizer"] == "parent"


def test_the_alias_is_not_hashed_before_it_is_resolved(tmp_path):
    tuned = config(tmp_path, init_from=PARENT)
    assert parent.stage_config(tuned) == {
        "name": "general",
        "version": None,
        "weights_sha256": None,
    }


@pytest.mark.parametrize(
    ("train", "key", "words"),
    [
        ({"init_from": "models:/general"}, "train.init_from", "is not models:/<name>/<version>"),
        ({"freeze": ["encoder"]}, "train.freeze", "needs init_from"),
        ({"init_from": PARENT, "freeze": ["decoder"]}, "train.freeze[0]", "'decoder'"),
        ({"init_from": PARENT, "freeze": ["encoder", "encoder"]}, "train.freeze", "twice"),
        ({"init_from": PARENT, "reset_optimizer": True}, "train.reset_optimizer", "unknown"),
        ({"keep_optimizer": True}, "train.keep_optimizer", "needs init_from"),
        ({"init_from": PARENT, "keep_optimizer": True}, "train.keep_optimizer", "weights only"),
        (
            {
                "init_from": "runs/g/train_ray/r/step-9",
                "keep_optimizer": True,
                "freeze": ["encoder"],
            },
            "train.keep_optimizer",
            "with freeze",
        ),
    ],
)
def test_bad_keys_are_one_line_naming_them(tmp_path, train, key, words):
    with pytest.raises(ConfigError) as caught:
        config(tmp_path, **train)
    assert caught.value.key == key and words in caught.value.message
    assert "\n" not in str(caught.value)


def test_a_relative_parent_folder_is_made_absolute_at_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config(tmp_path, init_from="runs/general/average").train.init_from == str(
        tmp_path / "runs/general/average"
    )


def test_a_model_shape_that_is_not_the_parents_is_one_line_naming_the_keys():
    base = presets.debug()
    wider = base.replace(d_model=128, n_heads=8)
    assert (
        shape_mismatch(wider, base)
        == "model.d_model 128 != parent's 64; model.n_heads 8 != parent's 4"
    )
    # Dropout, smoothing and the sinusoids' length shape no weight: a fine-tuning sets its own.
    assert shape_mismatch(base.replace(dropout=0.3, label_smoothing=0.0, max_len=99), base) is None
    learned = base.replace(positional="learned")
    assert "model.max_len 99" in shape_mismatch(learned.replace(max_len=99), learned)


def test_the_parents_weights_are_loaded_and_frozen_parts_leave_the_optimizer(tmp_path):
    cfg = presets.debug().replace(max_len=64)
    torch.manual_seed(0)
    trained = Transformer(cfg, 40)
    weights = checkpoint.save(tmp_path / "model.pt", trained, cfg, vocab_size=40)
    torch.manual_seed(1)
    child = Transformer(cfg, 40)
    start_from_parent(child, weights, ["embeddings", "encoder"])
    for (name, a), b in zip(trained.state_dict().items(), child.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    frozen = {n for n, p in child.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(("src_embed", "encoder_layers")) for n in frozen)
    assert all(p.requires_grad for n, p in child.named_parameters() if n.startswith("decoder"))
    trainable = sum(p.numel() for p in child.parameters() if p.requires_grad)
    adam = make_optimizer(child)
    assert sum(p.numel() for g in adam.param_groups for p in g["params"]) == trainable


def test_a_parent_folder_is_a_work_dirs_average_or_train_folder_with_its_tokenizer(tmp_path):
    (tmp_path / "average").mkdir()
    (tmp_path / "train" / "final").mkdir(parents=True)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "average" / "model.pt").write_bytes(b"w")
    (tmp_path / "train" / "final" / "model.pt").write_bytes(b"w")
    (tmp_path / "tokenizer" / "spm.model").write_bytes(b"t")
    assert parent.folder_files(tmp_path / "average") == (
        tmp_path / "average" / "model.pt",
        tmp_path / "tokenizer",
    )
    assert parent.folder_files(tmp_path / "train")[0] == tmp_path / "train/final/model.pt"
    with pytest.raises(StageError, match=r"^train.init_from .*nowhere: no model.pt in it"):
        parent.folder_files(tmp_path / "nowhere")
    (tmp_path / "tokenizer" / "spm.model").unlink()
    with pytest.raises(StageError, match="no tokenizer/ folder in its work dir"):
        parent.folder_files(tmp_path / "average")


def test_a_folder_parent_is_pinned_by_its_weights_sha256(tmp_path):
    from transformer_core.folders import sha256_file

    (tmp_path / "average").mkdir()
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "average" / "model.pt").write_bytes(b"weights")
    (tmp_path / "tokenizer" / "spm.model").write_bytes(b"t")
    tuned = config(tmp_path, init_from=str(tmp_path / "average"))
    pin = parent.resolve(tuned).parent
    assert pin is not None and pin.version == parent.FOLDER_VERSION
    assert pin.weights_sha256 == sha256_file(tmp_path / "average" / "model.pt")


def test_a_fine_tuned_version_is_tagged_with_its_parent_and_another_with_none(tmp_path):
    import json

    from tasks.framework.lineage import parent_tags

    record = {"name": "general", "version": 3, "found_by": PARENT, "weights_sha256": "c" * 64}
    (tmp_path / "parent.json").write_text(json.dumps({**record, "run_id": "r"}))
    assert parent_tags({"tokenizer": tmp_path}) == {
        "parent.name": "general",
        "parent.version": "3",
        "parent.found_by": PARENT,
        "parent.weights_sha256": "c" * 64,
    }
    assert parent_tags({"tokenizer": tmp_path / "elsewhere"}) == {}


def adam_after_steps(module: Transformer, steps: int) -> torch.optim.Adam:
    """Adam on ``module`` after ``steps`` updates of a made-up loss (so it has moments)."""
    adam = make_optimizer(module)
    schedule = make_scheduler(adam, d_model=64, warmup_steps=4)
    for _ in range(steps):
        loss = sum((p.float() ** 2).sum() for p in module.parameters())
        adam.zero_grad()
        loss.backward()
        adam.step()
        schedule.step()
    return adam


def test_keep_optimizer_continues_the_parents_adam_moments_under_a_fresh_schedule(tmp_path):
    cfg = presets.debug().replace(max_len=64)
    torch.manual_seed(0)
    trained = Transformer(cfg, 40)
    parent_adam = adam_after_steps(trained, 3)
    weights = checkpoint.save(
        tmp_path / "model.pt", trained, cfg, vocab_size=40, optimizer=parent_adam.state_dict()
    )
    child = Transformer(cfg, 40)
    start_from_parent(child, weights)
    adam = make_optimizer(child)
    make_scheduler(adam, d_model=64, warmup_steps=100)  # sets the fresh schedule's first lr
    fresh_lr = [g["lr"] for g in adam.param_groups]
    keep_parent_moments(adam, weights)
    assert [g["lr"] for g in adam.param_groups] == fresh_lr  # the fine-tuning's schedule
    theirs = list(parent_adam.state.values())
    ours = [adam.state[p] for p in adam.param_groups[0]["params"]]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[key], b[key]), key
    weights_only = checkpoint.save(tmp_path / "w.pt", trained, cfg, vocab_size=40)
    with pytest.raises(ValueError, match="holds weights only"):
        keep_parent_moments(adam, weights_only)


def test_a_ray_train_checkpoint_is_a_parent_folder_with_its_work_dirs_tokenizer(tmp_path):
    step = tmp_path / "train_ray" / "train-abc" / "step-000000009"
    step.mkdir(parents=True)
    (tmp_path / "tokenizer").mkdir()
    (step / "model.pt").write_bytes(b"w")
    (tmp_path / "tokenizer" / "spm.model").write_bytes(b"t")
    assert parent.folder_files(step) == (step / "model.pt", tmp_path / "tokenizer")
