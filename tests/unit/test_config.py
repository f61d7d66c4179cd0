"""Run configs: every shipped YAML loads; bad keys and values fail naming the key path."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml

from tasks.framework.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    fingerprint,
    load_config,
    to_dict,
)
from training.config import TrainConfig
from transformer_core import presets
from transformer_core.config import ModelConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_configs_folder_is_not_empty():
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_big"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path):
    config = load_config(path)
    assert isinstance(config, RunConfig)
    assert isinstance(config.model, ModelConfig)
    # The plain-dict form round-trips through the loader.
    data = to_dict(config)
    data["model"] = {"preset": "base", **data["model"]}
    assert config_from_dict(data) == config


def test_paper_presets_in_shipped_configs():
    base = load_config(Path(CONFIGS[0]).parent / "wmt14_en_de_base.yaml")
    assert base.model == presets.base()
    assert base.tokenizer.vocab_size == 37000 and base.tokenizer.kind == "bpe"
    big = load_config(Path(CONFIGS[0]).parent / "wmt14_en_de_big.yaml")
    assert big.model == presets.big() and big.model.dropout == 0.3
    assert big.average.last == 20
    fr = load_config(Path(CONFIGS[0]).parent / "wmt14_en_fr_big.yaml")
    assert fr.model.dropout == 0.1 and fr.tokenizer.kind == "wordpiece"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_shipped_configs_step_is_the_tokens_it_states(path: Path):
    """The step's padded tokens a side, from its workers and micro-batches, are the config's
    tokens_per_step (no silent rounding up), and a figure on that line's comment is the same."""
    import re

    train = load_config(path).train
    if train.elastic:
        return
    step = train.batches_per_step(train.max_workers) * train.max_tokens_per_batch
    assert step == train.tokens_per_step, f"{path.name}: a step is {step} tokens"
    number = r"(\d{1,3}(?:,\d{3})+|\d+)"
    for line in path.read_text().splitlines():
        if line.strip().startswith("tokens_per_step:") and "#" in line:
            comment = line.split("#", 1)[1]
            products = re.findall(rf"{number} workers? x {number}", comment)
            figures = re.findall(rf"{number} (?:padded )?tokens", comment)
            stated = [int(a.replace(",", "")) * int(b.replace(",", "")) for a, b in products]
            stated += [int(n.replace(",", "")) for n in figures]
            assert all(n == step for n in stated), f"{path.name}: {comment!r}, a step is {step}"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_heads_must_divide_width(tmp_path: Path):
    path = _write(tmp_path, {"name": "x", "model": {"preset": "base", "n_heads": 7}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.key == "model.n_heads"
    assert str(err.value).startswith("model.n_heads: 7 does not divide d_model 512")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"model": {"nheads": 8}}, "model.nheads"),
        ({"trian": {}}, "trian"),
        ({"train": {"stepz": 3}}, "train.stepz"),
        ({"train": {"steps": "many"}}, "train.steps"),
        ({"train": {"steps": 0}}, "train.steps"),
        ({"tokenizer": {"kind": "chars"}}, "tokenizer.kind"),
        ({"model": {"dropout": 1.5}}, "model.dropout"),
        ({"model": {"preset": "huge"}}, "model.preset"),
        ({"train": {"adam_betas": [0.9]}}, "train.adam_betas"),
        ({"clean": {"max_ratio": 0.5}}, "clean.max_ratio"),
        ({"train": {"use_gpu": "yes"}}, "train.use_gpu"),
        ({"decode": {"dtype": "float16"}}, "decode.dtype"),
        ({"train": {"precision": "fp16"}}, "train.precision"),
        ({"train": {"compile": ["graphs"]}}, "train.compile[0]"),
        # A pair the source cannot make fails at load, not when download runs.
        ({"data": {"source": "synthetic", "pair": "en-xx"}}, "data.pair"),
        ({"data": {"source": "wmt14", "pair": "en-xx"}}, "data.pair"),
        ({"data": {"source": "wmt14", "corpora": ["europarl", "gigaword"]}}, "data.corpora"),
    ],
)
def test_bad_keys_and_values_name_the_key_path(tmp_path: Path, data: dict, key: str):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, {"name": "x", **data}))
    assert err.value.key == key
    assert str(err.value).startswith(key + ":")
    assert str(tmp_path / "run.yaml") in str(err.value)


@pytest.mark.parametrize(
    ("train", "line"),
    [
        ({"cpu_bf16": True}, "train.cpu_bf16: replaced by train.precision (bf16 on a CPU: "
         "precision: bf16)"),
        ({"bf16": False}, "train.bf16: replaced by train.precision (false: precision: float32; "
         "true: auto)"),
        ({"compile_loss": True}, "train.compile_loss: replaced by train.compile: [loss]"),
        ({"compile": True}, "train.compile: a list now: [model] (what true was), [loss] or [] "
         "(what false was)"),
        ({"compile": False}, "train.compile: a list now: [model] (what true was), [loss] or [] "
         "(what false was)"),
    ],
)  # fmt: skip
def test_old_numerics_keys_are_refused_naming_what_replaced_them(tmp_path: Path, train, line):
    path = _write(tmp_path, {"name": "x", "train": {"steps": 3, **train}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{line} (in {path})"


def test_the_numerics_are_two_settings(tmp_path: Path):
    path = _write(tmp_path, {"name": "x", "train": {"precision": "bf16", "compile": ["loss"]}})
    train = load_config(path).train
    assert (train.precision, train.compile) == ("bf16", ("loss",))
    assert to_dict(train)["compile"] == ["loss"]
    default = load_config(_write(tmp_path, {"name": "x"})).train
    assert (default.precision, default.compile) == ("auto", ())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compile": True}, "compile: a list now: [model] (what true was)"),
        ({"compile": ("loss", "loss")}, "compile: [loss, loss] names a part twice"),
        ({"compile": ("loss", "model")}, "compile: [loss, model]: model compiles the loss too"),
        ({"compile": ("graphs",)}, "compile: 'graphs' is not one of 'model', 'loss'"),
        ({"precision": "fp16"}, "precision: 'fp16' is not one of 'auto', 'float32', 'bf16'"),
        (
            {"compile": ("loss",), "static_shapes": True, "merge_micro_batches": True},
            "static_shapes: does not combine with compile ([model] or [loss]) or fused_loss",
        ),
    ],
)
def test_the_compile_list_and_precision_are_checked_in_python_too(changes, message):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**changes)
    assert str(err.value).startswith(message)


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1500\n  warmup_steps: 400\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    # One line naming the file, line and column, not PyYAML's five about "<unicode string>".
    assert str(err.value).splitlines() == [str(err.value)]
    assert f"{bad}:3:15: invalid YAML: expected ',' or ']', but got ':'" in str(err.value)
    assert "flow sequence at line 2" in str(err.value)
    bad.write_text("name: x\ndata:\n\tsource: synthetic\n")
    with pytest.raises(ConfigError, match=rf"{bad}:3:1: invalid YAML: found character '\\t'"):
        load_config(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(top)


def test_name_defaults_to_file_stem_and_overrides_apply(tmp_path: Path):
    path = tmp_path / "my_run.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "debug"}}))
    config = load_config(path, {"train.steps": 7, "model.dropout": 0.0})
    assert config.name == "my_run"
    assert config.train.steps == 7
    assert config.model == presets.debug().replace(dropout=0.0)
    # The work dir is resolved once, at load, against the current directory.
    assert config.root == Path(config.workdir) == Path.cwd() / "runs" / "my_run"
    assert not config.store.remote


def test_a_work_dir_on_an_object_store_loads_and_keeps_its_local_files_in_the_node_cache(
    tmp_path: Path, monkeypatch
):
    data = {
        "name": "r",
        "workdir": "s3://bucket/team/{name}/",
        "mlflow": {"tracking_uri": "http://127.0.0.1:5000"},
        "storage": {"endpoint": "http://127.0.0.1:8333", "cache_dir": str(tmp_path)},
    }
    config = config_from_dict(data)
    assert config.workdir == "s3://bucket/team/r"
    assert config.store.remote and config.store.base == "bucket/team/r"
    assert config.store.endpoint == "http://127.0.0.1:8333"
    assert config.root.parent == tmp_path / "runs" and config.root.name.startswith("r-")
    # Another bucket, another local folder: two runs of one name never share one.
    other = config_from_dict({**data, "workdir": "s3://other/team/{name}"})
    assert other.root != config.root
    assert config_from_dict({**data, "workdir": "gs://bucket/p"}).store.remote


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"workdir": "s3://bucket/run"}, "mlflow.tracking_uri: the work dir"),
        ({"workdir": "ftp://host/run"}, "workdir: 'ftp://host/run': use a local path, s3://"),
    ],
)
def test_a_work_dir_that_cannot_be_written_as_given_fails_at_load_in_one_line(data, words):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "r", **data})
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"workdir": "s3:///run"}, "no bucket"),
        ({"workdir": "s3://AKIAX:hunter22@bucket/run"}, "put credentials in environment"),
        (
            {"workdir": "s3://bucket/run", "storage": {"access_key_env": "TFM_TEST_UNSET_KEY"}},
            "$TFM_TEST_UNSET_KEY",
        ),
    ],
)
def test_a_store_that_cannot_work_fails_in_one_line_when_a_command_opens_it(
    data: dict, words: str, monkeypatch
):
    """Loading builds no client: the store's URI and credential variables are looked at by the
    command that opens the work dir, in one line on ``workdir``."""
    monkeypatch.delenv("TFM_TEST_UNSET_KEY", raising=False)
    config = config_from_dict({"name": "r", "mlflow": {"tracking_uri": "http://h:5000"}, **data})
    with pytest.raises(ConfigError) as err:
        _ = config.store
    assert err.value.key == "workdir" and words in str(err.value) and "\n" not in str(err.value)
    assert "hunter22" not in str(err.value)


def test_preset_table3_rows_load(tmp_path: Path):
    config = load_config(_write(tmp_path, {"name": "x", "model": {"preset": "table3:A16"}}))
    assert config.model.n_heads == 16 and config.model.head_dim_k == 32


def test_tracking_uri_defaults_to_sqlite_in_workdir(tmp_path: Path, monkeypatch):
    config = config_from_dict({"name": "r", "workdir": str(tmp_path / "{name}")})
    assert config.tracking_uri == f"sqlite:///{tmp_path / 'r' / 'mlflow.db'}"
    config = config_from_dict({"name": "r", "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}})
    assert config.tracking_uri == "http://127.0.0.1:5000"


def test_tracking_uri_null_takes_the_team_server_the_process_started_with(monkeypatch):
    # MLFLOW_TRACKING_URI as read at start (mlflow.set_tracking_uri rewrites the variable later),
    # handed to the loader; the variable now is not read.
    team = "http://10.0.0.5:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/the-last-run.db")
    config = config_from_dict({"name": "r"}, team_tracking_uri=team)
    assert config.tracking_uri == team
    assert config.replace(seed=1).tracking_uri == team  # a copy keeps it
    assert "team_tracking_uri" not in to_dict(config)  # not a setting: never hashed nor logged
    assert config_from_dict({"name": "r"}).tracking_uri.startswith("sqlite:///")
    explicit = {"name": "r", "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}}
    assert (
        config_from_dict(explicit, team_tracking_uri=team).tracking_uri
        == explicit["mlflow"]["tracking_uri"]
    )  # the config wins


def test_name_is_required():
    with pytest.raises(ConfigError) as err:
        config_from_dict({})
    assert err.value.key == "name"


def test_placement_strategy_is_one_of_rays():
    config = config_from_dict({"name": "r", "train": {"placement_strategy": "SPREAD"}})
    assert config.train.placement_strategy == "SPREAD"
    assert config_from_dict({"name": "r"}).train.placement_strategy == "PACK"
    with pytest.raises(ConfigError, match="'spread' is not one of PACK, SPREAD") as err:
        config_from_dict({"name": "r", "train": {"placement_strategy": "spread"}})
    assert err.value.key.endswith("placement_strategy")


def test_register_metric_is_one_that_the_score_stage_writes():
    from evaluation.bleu import METRICS

    for metric in METRICS:  # each metric of scores.json can decide the champion
        assert (
            config_from_dict({"name": "r", "register": {"metric": metric}}).register.metric
            == metric
        )
    # A misspelt metric fails when the config loads, not at register after hours of training.
    with pytest.raises(ConfigError, match="'bleu' is not one of") as err:
        config_from_dict({"name": "r", "register": {"metric": "bleu"}})
    assert err.value.key == "register.metric"


def test_a_bad_override_is_blamed_on_set_not_on_the_file(tmp_path: Path):
    path = _write(tmp_path, {"name": "x", "model": {"preset": "debug"}})
    with pytest.raises(ConfigError, match=r"train.steps: .*\(from --set train.steps='many'\)"):
        load_config(path, {"train.steps": "many"})
    with pytest.raises(ConfigError, match=rf"\(in {path}\)"):
        load_config(_write(tmp_path, {"name": "x", "train": {"steps": "many"}}), {"seed": 3})
    with pytest.raises(
        ConfigError, match=r"^train.stepz: unknown key .*\(from --set train.stepz=3\)$"
    ):
        load_config(_write(tmp_path, {"name": "x"}), {"train.stepz": 3})
    # An item of a list given by --set (its key ends in [i]) is blamed on --set too.
    with pytest.raises(
        ConfigError,
        match=r"^parsing.dev_files\[0\]: .*\(from --set parsing.dev_files=\['/abs'\]\)$",
    ):
        load_config(_write(tmp_path, {"name": "x"}), {"parsing.dev_files": ["/abs"]})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train": {"steps": "3"}}, "train.steps: '3' must be an integer"),
        ({"train": {"steps": 1.5}}, "train.steps: 1.5 must be an integer"),
        ({"train": {"use_gpu": 1}}, "train.use_gpu: 1 must be true or false"),
        ({"train": {"lr_scale": "x"}}, "train.lr_scale: 'x' must be a number"),
        ({"train": {"clip_norm": True}}, "train.clip_norm: True must be a number"),
        ({"register": {"model_name": 5}}, "register.model_name: 5 must be a string"),
        ({"data": {"corpora": "europarl-v7"}}, "data.corpora: 'europarl-v7' must be a list"),
        ({"data": {"corpora": ["europarl-v7", 2]}}, "data.corpora[1]: 2 must be a string"),
        (
            {"train": {"adam_betas": [0.9, 0.98, 0.9]}},
            "train.adam_betas: [0.9, 0.98, 0.9] must have 2 items",
        ),
        (
            {"train": {"num_workers": "x"}},
            "train.num_workers: 'x' must be an integer; 'x' must be a list",
        ),
        (
            {"tokenizer": {"kind": "chars"}},
            "tokenizer.kind: 'chars' is not one of 'bpe', 'wordpiece'",
        ),
        (
            {"decode": {"length_norm": "t2t"}},
            "decode.length_norm: 't2t' is not one of 'gnmt', 'fairseq'",
        ),
        ({"train": 5}, "train: must be a mapping, got int"),
        ({"train": {"stepz": 3}}, "train.stepz: unknown key (known: steps, tokens_per_step, "),
        ({"model": {"nheads": 8}}, "model.nheads: unknown key (known: preset, n_layers, "),
        (
            {"model": {"preset": "debug", "d_k": 0}},
            "model.d_k: 0 must be a positive integer or null",
        ),
        # The stage-only sections' ranges are constraints on the fields (Ge(1)), said the same way.
        ({"average": {"last": 0}}, "average.last: 0 must be >= 1"),
        ({"mlflow": {"drain_seconds": -1}}, "mlflow.drain_seconds: -1 must be >= 0"),
        ({"parsing": {"evalb_max_error": -1}}, "parsing.evalb_max_error: -1 must be >= 0 or null"),
        (
            {"parsing": {"dev_files": ["22/*.mrg", "../x"]}},
            "parsing.dev_files[1]: '../x' must be a glob relative to treebank_dir",
        ),
        # YAML reads an unquoted date as a date, which JSON (and so no setting) holds.
        (
            {"data": {"dev": datetime.date(2013, 1, 1)}},
            "data.dev: datetime.date(2013, 1, 1) is a YAML date",
        ),
    ],
)
def test_a_bad_value_says_what_was_expected_in_one_line(tmp_path: Path, data: dict, message: str):
    path = _write(tmp_path, {"name": "x", **data})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(message)
    assert str(err.value).endswith(f"(in {path})") and "\n" not in str(err.value)


def test_of_several_bad_keys_the_first_written_is_reported():
    for train, key in [
        ({"stepz": 1, "steps": "many"}, "train.stepz"),
        ({"steps": "many", "stepz": 1}, "train.steps"),
    ]:
        with pytest.raises(ConfigError) as err:
            config_from_dict({"name": "x", "train": train})
        assert err.value.key == key


def test_values_take_their_fields_types_so_fingerprints_do_not_depend_on_spelling():
    # Stage fingerprints hash the config's dict form: 2 and 2.0 for a float must give one hash.
    spelled = config_from_dict({"name": "r", "train": {"lr_scale": 2, "adam_betas": [1, 0.98]}})
    typed = config_from_dict({"name": "r", "train": {"lr_scale": 2.0, "adam_betas": (1.0, 0.98)}})
    assert type(spelled.train.lr_scale) is float and spelled.train.adam_betas == (1.0, 0.98)
    assert type(spelled.train.adam_betas[0]) is float and spelled == typed
    assert fingerprint(spelled) == fingerprint(typed)


def test_train_decay_is_checked_by_name_and_linear_must_end_after_its_warmup():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "r", "train": {"decay": "cosine"}})
    assert str(err.value).startswith("train.decay: 'cosine' is not one of")
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "r", "train": {"decay": "linear", "steps": 200}})
    assert str(err.value) == (
        "train.warmup_steps: 4000 exceeds steps 200 (decay: linear ends at steps)"
    )
    assert TrainConfig(decay="linear", steps=4000).decay == "linear"
