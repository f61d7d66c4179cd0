"""The distill pipeline's parts that need no services: the teacher's reference in a config, the
pipeline's place in the stage table, the filter's choice and the score it ranks by."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from corpora.score_filter import worst
from serving.corpus_translation import mean_log_prob
from tasks.framework import graph
from tasks.framework.config import ConfigError, config_from_dict, load_config
from tasks.framework.config_sections import ModelReference, TeacherPin
from transformer_core import Transformer, count_parameters
from transformer_core.search_settings import BeamSettings, Hypothesis, length_penalty

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    ("uri", "reference"),
    [
        ("models:/multi30k-en-de@champion", ModelReference("multi30k-en-de", alias="champion")),
        ("models:/quickstart-translator/12", ModelReference("quickstart-translator", version=12)),
    ],
)
def test_a_teacher_is_named_by_alias_or_by_version(uri, reference):
    assert ModelReference.parse(uri) == reference
    assert str(reference) == uri
    config = config_from_dict({"name": "d", "distill": {"teacher": uri}})
    assert graph.pipeline_name(config) == "distill"


@pytest.mark.parametrize(
    "uri", ["multi30k-en-de", "models:/x", "models:/x/0", "models:/x/v2", "models:/@a", "runs:/x"]
)
def test_a_malformed_teacher_is_a_config_error_naming_the_key(uri):
    with pytest.raises(ConfigError, match=r"^distill\.teacher: .* is not models:/<name>/<vers"):
        config_from_dict({"name": "d", "distill": {"teacher": uri}})


def test_without_a_teacher_the_config_runs_the_main_pipeline_and_parsing_has_none():
    assert graph.pipeline_name(config_from_dict({"name": "d"})) == "wmt14"
    data = {"source": "treebank", "pair": "words-tree"}
    with pytest.raises(ConfigError, match="^distill.teacher: names the distill pipeline and da"):
        config_from_dict({"name": "d", "data": data, "distill": {"teacher": "models:/x/1"}})


def test_the_distill_pipeline_reuses_the_stages_with_the_filtered_corpus_as_clean():
    stages = {s.name: s for s in graph.DISTILL}
    # holdout runs only for a config that holds a test set out (eval.test_sets), parent only for
    # a fine-tuned student (train.init_from).
    assert list(stages)[:7] == [
        "teacher",
        "parent",
        "download",
        "clean",
        "holdout",
        "distill",
        "filter",
    ]
    assert stages["tokenizer"].inputs == {"clean": "filter"}
    assert stages["shard"].inputs == {"clean": "filter", "tokenizer": "tokenizer"}
    assert stages["score"].inputs["download"] == "download"  # scored on the references
    assert stages["register"].inputs["teacher"] == "teacher"
    # The same modules as the main pipeline's: composed, not copied.
    main = {s.name: s for s in graph.WMT14}
    for name in ("train", "average", "translate", "score"):
        assert stages[name] == main[name]


def test_a_relative_sqlite_registry_is_resolved_once_at_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = config_from_dict({"name": "d", "mlflow": {"tracking_uri": "sqlite:///runs/q/m.db"}})
    assert config.tracking_uri == f"sqlite:///{tmp_path}/runs/q/m.db"
    absolute = f"sqlite:///{tmp_path}/m.db"
    assert config_from_dict({"name": "d", "mlflow": {"tracking_uri": absolute}}).tracking_uri == (
        absolute
    )


def test_the_filter_drops_the_lowest_share_of_the_rows_it_may_keep_ties_in_row_order():
    scores = np.array([-1.0, -3.0, -0.5, -3.0, -2.0, -9.0, -0.1, -3.0, -0.2, -0.3])
    empty = np.zeros(10, dtype=bool)
    empty[5] = True  # dropped anyway, and not counted in the share
    dropped = worst(scores, 0.3, keep=~empty)  # 30% of the 9 it may keep: 2
    assert np.flatnonzero(dropped).tolist() == [1, 3]  # three tie at -3.0: the first two go
    assert worst(scores, 0.0).sum() == 0
    assert np.flatnonzero(worst(scores, 0.1)).tolist() == [5]


@pytest.mark.parametrize("norm", ["gnmt", "fairseq"])
def test_the_score_is_the_mean_log_probability_of_the_decoded_positions(norm):
    decode = BeamSettings(alpha=0.6, length_norm=norm)
    tokens, summed = [5, 6, 7], -2.4  # three pieces and EOS
    hyp = Hypothesis(tokens, summed / length_penalty(4, decode.alpha, norm))
    assert mean_log_prob(hyp, decode) == pytest.approx(summed / 4)
    assert mean_log_prob(Hypothesis([], 0.0), decode) == 0.0  # an empty source, undecoded


def test_the_teacher_is_resolved_by_its_stage_once_however_the_alias_moves(monkeypatch):
    """Loading asks the registry nothing; the teacher stage's ``resolve`` asks it once, and the
    config it runs with (its fingerprint, its build, a retry) keeps that version. A config
    loaded anew (the next run) asks again."""
    from tasks import teacher

    answers = iter([TeacherPin("t", v, f"sha{v}", "run", "models:/t@a") for v in (3, 4)])
    monkeypatch.setattr(teacher, "registry_version", lambda config: next(answers))
    data = {"name": "d", "distill": {"teacher": "models:/t@a"}}
    config = config_from_dict(data)
    assert config.distill.pinned is None
    assert teacher.stage_config(config) == {"name": "t", "version": None, "weights_sha256": None}
    spec = graph.spec(config, "teacher")
    pinned = spec.resolve(config)
    first = teacher.stage_config(pinned)
    assert first == {"name": "t", "version": 3, "weights_sha256": "sha3"}
    assert spec.resolve(pinned) is pinned and teacher.stage_config(pinned) == first
    assert pinned.replace(seed=5).distill.pinned == pinned.distill.pinned  # a copy keeps it
    assert spec.resolve(config_from_dict(data)).distill.pinned.version == 4
    # Never a setting: not in what is hashed or logged, nor a key a config may write.
    from tasks.framework.config import to_dict

    assert "pinned" not in to_dict(pinned.distill)
    with pytest.raises(ConfigError, match=r"^distill\.pinned: unknown key \(known: teacher,"):
        config_from_dict({"name": "d", "distill": {"teacher": "models:/t@a", "pinned": None}})


def test_status_asks_the_registry_and_where_it_cannot_takes_what_the_folder_records(
    tmp_path, monkeypatch
):
    from mlflow.exceptions import MlflowException

    from tasks import teacher

    config = config_from_dict({"name": "d", "distill": {"teacher": "models:/t@a"}})
    stats = {"name": "t", "version": 3, "weights_sha256": "sha3", "found_by": "models:/t@a"}
    monkeypatch.setattr(
        teacher, "registry_version", lambda c: TeacherPin("t", 4, "sha4", "r", "models:/t@a")
    )
    moved, why = teacher.looked_up(config, {"stats": stats})  # a new champion: stale
    assert (teacher.stage_config(moved)["version"], why) == (4, None)

    def down(config):
        raise MlflowException("Connection refused")  # as MLflow wraps a refused connection

    monkeypatch.setattr(teacher, "registry_version", down)
    found, why = teacher.looked_up(config, {"stats": stats})
    assert teacher.stage_config(found) == {"name": "t", "version": 3, "weights_sha256": "sha3"}
    where = f"distill.teacher models:/t@a: the registry at {config.tracking_uri}"
    assert why == f"version 3 as its folder records it: {where} did not answer"
    same, why = teacher.looked_up(config, None)  # never ran: not resolved
    assert (same, why) == (config, f"not resolved: {where} did not answer")
    other = {**stats, "found_by": "models:/t/2"}  # the config names another reference now
    assert teacher.looked_up(config, {"stats": other})[0] is config


def _shipped_parameters(config) -> int:
    return count_parameters(Transformer(config.model, config.tokenizer.vocab_size))


def test_each_shipped_student_is_a_fifth_smaller_than_its_shipped_teacher_as_its_comment_says():
    configs = {p: load_config(p) for p in sorted(CONFIGS.glob("*.yaml"))}
    teachers = {c.register.model_name: c for c in configs.values() if c.distill.teacher is None}
    students = {p: c for p, c in configs.items() if c.distill.teacher is not None}
    assert {p.stem for p in students} == {"multi30k_en_de_distill", "quickstart_distill"}
    for path, student in students.items():
        teacher = teachers[ModelReference.parse(student.distill.teacher).name]
        counts = _shipped_parameters(student), _shipped_parameters(teacher)
        assert counts[0] <= 0.8 * counts[1], (path.name, counts)
        text = path.read_text(encoding="utf-8")
        assert all(f"{n:,}" in text for n in counts), (path.name, counts)
