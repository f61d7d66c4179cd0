"""``tfm evaluate`` of a registered tiny model: the score stage's figures on the same test set
given as a TSV, a comparison with itself, the tags on the version, bad test files in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.stage_folders import finished_folder, tiny_sentences

from pipelines.cli import main
from serving.translator import Translator
from tasks.framework.config import DecodeConfig, MlflowConfig, RegisterConfig, RunConfig
from tasks.framework.runner import run_stage
from transformer_core import presets

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # Its time budget: 45 s alone on 2 cores under load (the default suite keeps the flow test).
    pytest.mark.timeout(300),
]

NAME = "tiny-evaluated"
SOURCES = tiny_sentences(24, seed=7)
REFS = [" ".join(reversed(s.split()[:2])) + " " + " ".join(s.split()[2:]) for s in SOURCES]
"""The copy model's references, with their first two words swapped: figures between 0 and 100."""
FIGURES = ("bleu_sacre", "bleu_tok_compound", "bleu_tok_lc", "chrf")


def _text_folder(root: Path, stage: str, files: dict[str, list[str]]) -> Path:
    def build(tmp: Path) -> dict:
        for name, lines in files.items():
            (tmp / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return {}

    return finished_folder(root / stage, stage, {"files": files}, build)


@pytest.fixture(scope="module")
def registered(tmp_path_factory, tiny_model, tiny_tokenizer):
    """The tiny model translated and scored by the score stage, then registered with those
    scores: (config, scores.json, root)."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("evaluate")
    config = RunConfig(
        name="evaluate",
        workdir=str(root / "run"),
        model=presets.debug(),
        decode=DecodeConfig(max_len_offset=6),
        register=RegisterConfig(model_name=NAME),
        mlflow=MlflowConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"),
    )
    MlflowClient(tracking_uri=config.tracking_uri).create_experiment(
        config.mlflow.experiment, artifact_location=(root / "mlartifacts").as_uri()
    )
    # What the translate stage writes (tests/integration/test_translate.py: its actors equal
    # this single-process decoding).
    hyps = Translator.load(tiny_model, tiny_tokenizer, config.decode).translate(SOURCES)
    # The download stage's folder in the run's work dir: the config's test set.
    download = _text_folder(config.root, "download", {"test.en": SOURCES, "test.de": REFS})
    translate = _text_folder(root, "translate", {"hyp.de": hyps})
    score = run_stage(config, "score", {"translate": translate, "download": download}).path
    inputs = {"average": tiny_model, "tokenizer": tiny_tokenizer, "score": score}
    run_stage(config, "register", inputs)
    scores = json.loads((score / "scores.json").read_text(encoding="utf-8"))
    assert 0 < scores["bleu_sacre"] < 100  # a test that can tell figures apart
    return config, scores, root


def evaluate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["evaluate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_evaluate_reproduces_the_score_stage_and_tags_the_version(registered, capsys) -> None:
    from mlflow.tracking import MlflowClient

    config, scores, root = registered
    tsv = root / "heldout.tsv"
    tsv.write_text("".join(f"{s}\t{r}\n" for s, r in zip(SOURCES, REFS, strict=True)))
    out = root / "report" / "heldout.json"
    model = f"models:/{NAME}@champion"
    uri = ["--tracking-uri", config.tracking_uri]
    code, stdout, _ = evaluate(
        capsys, "--model", model, "--test-set", str(tsv), "--json", str(out), *uri
    )
    assert code == 0
    (result,) = json.loads(out.read_text())["sets"]
    assert result["test_set"] == "heldout" and result["segments"] == len(SOURCES)
    for key in FIGURES:  # exactly the score stage's figures and signatures
        assert result["scores"][key] == scores[key], key
        assert result["scores"][f"{key}_signature"] == scores[f"{key}_signature"]
    assert f"{scores['bleu_sacre']:.2f}" in stdout and "heldout" in stdout
    assert "| heldout | 24 |" in (root / "report" / "heldout.md").read_text()

    tags = MlflowClient(config.tracking_uri, config.tracking_uri).get_model_version(NAME, "1").tags
    assert tags["eval.heldout.bleu_sacre"] == f"{scores['bleu_sacre']:.4f}"
    assert tags["eval.heldout.chrf"] == f"{scores['chrf']:.4f}"
    assert tags["eval.heldout.segments"] == "24"
    assert tags["eval.heldout.signature"] == scores["bleu_sacre_signature"]
    assert f"logged on {NAME} version 1" in stdout

    # Against itself: nothing to tell them apart, on every metric.
    against = ["--against", f"models:/{NAME}/1"]
    code, stdout, _ = evaluate(
        capsys, "--model", model, "--test-set", str(tsv), "--json", str(out), *against, *uri
    )
    assert code == 0
    (result,) = json.loads(out.read_text())["sets"]
    assert [c["metric"] for c in result["comparison"]] == [
        "bleu_sacre",
        "bleu_tok_compound",
        "chrf",
    ]
    for row in result["comparison"]:
        assert row["difference"] == 0 and row["low"] == row["high"] == 0
        assert row["p_value"] == 1.0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "95% interval" in stdout and "[+0.00, +0.00]" in stdout


def test_evaluate_on_the_config_test_set(registered, capsys) -> None:
    """With --config and no --test-set: its work dir's download folder, named as score names it."""
    import yaml

    config, scores, root = registered
    path = root / "evaluate.yaml"
    settings = {
        "name": config.name,
        "workdir": config.workdir,
        "mlflow": {"tracking_uri": config.tracking_uri},
    }
    path.write_text(yaml.safe_dump(settings))
    out = root / "config-set.json"
    code, stdout, _ = evaluate(
        capsys, "--model", f"models:/{NAME}/1", "--config", str(path), "--json", str(out)
    )
    assert code == 0
    (result,) = json.loads(out.read_text())["sets"]
    assert result["test_set"] == scores["test_set"] == "synthetic"
    assert {k: result["scores"][k] for k in FIGURES} == {k: scores[k] for k in FIGURES}


def test_a_misaligned_or_missing_test_file_is_one_line_naming_it(registered, capsys) -> None:
    config, _, root = registered
    (root / "short.en").write_text("the cat\nthe dog\nthe tree\n")
    (root / "short.de").write_text("the cat\nthe dog\n")
    model = ["--model", f"models:/{NAME}@champion", "--tracking-uri", config.tracking_uri]
    code, stdout, stderr = evaluate(capsys, *model, "--test-set", str(root / "short"))
    assert code == 1 and stdout.startswith("model:")
    (line,) = stderr.strip().splitlines()
    assert f"{root / 'short.en'} has 3 lines but {root / 'short.de'} has 2" in line

    code, _, stderr = evaluate(capsys, *model, "--test-set", str(root / "absent"))
    (line,) = stderr.strip().splitlines()
    assert code == 1 and f"{root / 'absent.en'} and {root / 'absent.de'} do not exist" in line
    code, _, stderr = evaluate(capsys, *model, "--test-set", str(root / "absent.tsv"))
    (line,) = stderr.strip().splitlines()
    assert code == 1 and f"{root / 'absent.tsv'} does not exist" in line

    for folder in ("a", "b"):  # two sets of one name would share their tags
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "same.tsv").write_text("the cat\tdie Katze\n")
    both = ["--test-set", str(root / "a" / "same.tsv"), "--test-set", str(root / "b" / "same.tsv")]
    code, _, stderr = evaluate(capsys, *model, *both)
    (line,) = stderr.strip().splitlines()
    assert code == 2 and "two test sets named same" in line
