"""The register stage on a SQLite registry: versions, lineage, aliases, and the pyfunc itself."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from helpers.stage_folders import finished_folder, tiny_sentences

from serving.stream import ModelNotFoundError, from_registry, translate_stream
from serving.translator import Translator
from tasks import register
from tasks.framework.config import DecodeConfig, MlflowConfig, RegisterConfig, RunConfig
from tasks.framework.manifest import read_manifest
from tasks.framework.results import StageError
from tasks.framework.runner import run_stage
from transformer_core import presets

pytestmark = pytest.mark.integration

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
TEXTS = ["the cat sees the dog", "a big red house", "dog", "the old tree walks to the new house"]


def make_score(root: Path, bleu: float, variant: str = "full") -> Path:
    """A score stage folder holding scores.json (a new fingerprint for each score)."""
    scores = {
        "bleu_sacre": bleu,
        "bleu_tok_compound": bleu + 0.5,
        "chrf": 40.0,
        "test_set": "newstest2014",
        "test_variant": variant,
        "signature": SIGNATURE,
    }

    def build(tmp: Path) -> dict:
        (tmp / "scores.json").write_text(json.dumps(scores))
        return scores

    return finished_folder(root / "score", "score", scores, build)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model, tiny_tokenizer):
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("register")
    config = RunConfig(
        name="reg",
        workdir=str(root / "run"),
        model=presets.debug(),
        decode=DecodeConfig(max_len_offset=6),
        register=RegisterConfig(model_name="tiny-translator"),
        mlflow=MlflowConfig(tracking_uri=f"sqlite:///{root / 'mlflow.db'}"),
    )
    # Artifacts under tmp_path: a new experiment's default location is ./mlruns in the CWD.
    MlflowClient(tracking_uri=config.tracking_uri).create_experiment(
        config.mlflow.experiment, artifact_location=(root / "mlartifacts").as_uri()
    )
    return config, {"average": tiny_model, "tokenizer": tiny_tokenizer}, root


def _register(
    config: RunConfig, inputs: dict, root: Path, bleu: float, variant: str = "full"
) -> dict:
    out = run_stage(config, "register", {**inputs, "score": make_score(root, bleu, variant)}).path
    return json.loads((out / "registered.json").read_text())


def translate_here(inputs: dict[str, Path], texts: list[str], decode: DecodeConfig) -> list[str]:
    return Translator.load(inputs["average"], inputs["tokenizer"], decode).translate(texts)


def _champion(config: RunConfig) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
    return str(client.get_model_version_by_alias(config.register.model_name, "champion").version)


def assert_version_tags(tags: dict[str, str], inputs: dict[str, Path], name: str) -> None:
    """A version's tags: its score and protocol, the lineage of its inputs, the code behind each
    stage and the checkout it came from, the run's config."""
    from tasks.framework.code_fingerprint import REPO
    from tasks.framework.config import fingerprint

    assert tags["bleu_sacre"] == "20.0" and tags["test_set"] == "newstest2014"
    assert tags["signature"] == SIGNATURE and tags["code_version"]
    assert tags["lineage.average"] == read_manifest(inputs["average"])["fingerprint"]
    assert tags["lineage.train"] == read_manifest(inputs["average"].parent / "train")["fingerprint"]
    assert tags["lineage.tokenizer"] == read_manifest(inputs["tokenizer"])["fingerprint"]
    # The code behind each stage, and the checkout it came from.
    assert tags["code.average"] == fingerprint(read_manifest(inputs["average"])["code"])
    assert tags["code.register"] and tags["code.register"] != tags["code.average"]
    if (REPO / ".git").exists():
        assert len(tags["git_commit"]) == 40 and tags["git_dirty"] in ("true", "false")
    assert json.loads(tags["config"])["register"]["model_name"] == name


def assert_params_change_decoding(
    model, inputs: dict[str, Path], config: RunConfig, expected: list[str]
) -> None:
    """A request may change the decoding: each setting gives what the Translator gives with it;
    an empty line is an empty translation; n-best lists come best first."""
    # The tiny model being what it is, at least one setting changes some translation.
    changed = False
    for params in (
        {"max_len_offset": 1},
        {"beam_size": 1},
        {"alpha": 0.0},
        {"length_norm": "fairseq"},
        {"max_len_offset": 0},
    ):
        here = translate_here(inputs, TEXTS, DecodeConfig(**{**asdict(config.decode), **params}))
        assert model.predict(TEXTS, params=params) == here, params
        changed |= here != expected
    assert changed
    # An empty line is an empty translation (nothing is decoded, so nothing is made up), also
    # among other lines and with n-best.
    assert model.predict(["", TEXTS[0], "  "]) == ["", expected[0], ""]
    assert model.predict([""], params={"n_best": 3}) == [[{"translation": "", "score": 0.0}]]
    # ... or ask for the n best translations, best first, the first being the translation.
    nbest = model.predict(TEXTS, params={"n_best": 3})
    assert [hyps[0]["translation"] for hyps in nbest] == expected
    for hyps in nbest:
        assert len(hyps) == 3
        assert [h["score"] for h in hyps] == sorted((h["score"] for h in hyps), reverse=True)


def assert_model_carries_only_its_code(name: str, root: Path) -> None:
    """The model carries the serving code, the model library and parsing (for tree-constrained
    decoding), nothing else of this project; nothing is unpickled on load."""
    import mlflow

    local = Path(
        mlflow.artifacts.download_artifacts(f"models:/{name}@champion", dst_path=str(root / "dl"))
    )
    assert sorted(p.name for p in (local / "code").iterdir()) == [
        "parsing",
        "serving",
        "transformer_core",
    ]
    # Nothing is unpickled on load: the version is code (models from code) and artifacts.
    mlmodel = (local / "MLmodel").read_text()
    assert "model_code_path" in mlmodel and not list(local.rglob("*.pkl"))


def predict_in_a_fresh_process(config: RunConfig, name: str, root: Path) -> dict:
    """The champion's predictions for TEXTS in a fresh process, importing the code the model
    carries (code_paths), and the file its serving code came from."""
    script = (
        "import json, sys, mlflow\n"
        f"mlflow.set_tracking_uri({config.tracking_uri!r})\n"
        f"m = mlflow.pyfunc.load_model('models:/{name}@champion')\n"
        f"out = m.predict({TEXTS!r})\n"
        "import serving.translator as t\n"
        "print(json.dumps({'out': out, 'code': t.__file__}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_tfm_translate(config: RunConfig, name: str, expected: list[str]) -> None:
    """`tfm translate`: stdin lines to stdout lines; with --n-best, Moses' n-best lines."""
    stdout = io.StringIO()
    predict = from_registry(f"models:/{name}@champion", config.tracking_uri)
    count = translate_stream(predict, io.BytesIO("".join(t + "\n" for t in TEXTS).encode()), stdout)
    assert count == len(TEXTS) and stdout.getvalue().splitlines() == expected
    stdout = io.StringIO()
    translate_stream(predict, io.BytesIO(f"{TEXTS[0]}\n\n{TEXTS[1]}\n".encode()), stdout)
    assert stdout.getvalue().split("\n") == [expected[0], "", expected[1], ""]
    # With --n-best: Moses' "LINE ||| TRANSLATION ||| SCORE" lines, best first per line.
    stdout = io.StringIO()
    predict = from_registry(f"models:/{name}@champion", config.tracking_uri, {"n_best": 2})
    translate_stream(predict, io.BytesIO("".join(t + "\n" for t in TEXTS).encode()), stdout)
    lines = [line.split(" ||| ") for line in stdout.getvalue().splitlines()]
    assert [int(n) for n, _, _ in lines] == [i for i in range(len(TEXTS)) for _ in range(2)]
    assert [text for _, text, _ in lines[::2]] == expected


def test_registry_promotion_and_pyfunc(setup) -> None:
    from mlflow.tracking import MlflowClient

    config, inputs, root = setup
    name = config.register.model_name
    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)

    # 1. The first registration becomes champion (and candidate); the process's MLflow
    # variables stay as they were (a later command in it would take them for its team server).
    found = {v: os.environ.get(v) for v in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    first = _register(config, inputs, root, bleu=20.0)
    assert {v: os.environ.get(v) for v in found} == found
    assert first["version"] == 1 and first["aliases"] == ["candidate", "champion"]
    assert first["previous_champion"] is None and first["metric"] == {
        "name": "bleu_sacre",
        "value": 20.0,
    }
    assert_version_tags(client.get_model_version(name, "1").tags, inputs, name)

    # 2. A worse one is only a candidate; the champion stays.
    worse = _register(config, inputs, root, bleu=15.0)
    assert worse["version"] == 2 and worse["aliases"] == ["candidate"]
    assert worse["previous_champion"]["version"] == 1 and not worse["champion"]
    assert _champion(config) == "1"

    # 3. A better one takes the champion alias.
    better = _register(config, inputs, root, bleu=25.5)
    assert better["version"] == 3 and better["aliases"] == ["candidate", "champion"]
    assert _champion(config) == "3"
    assert client.get_model_version(name, "1").aliases == []

    # 4. A higher score on another protocol (the filtered test set) is never compared.
    other = _register(config, inputs, root, bleu=99.0, variant="filtered")
    assert other["aliases"] == ["candidate"] and _champion(config) == "3"
    assert "protocol differs" in other["decision"]
    assert read_manifest(config.root / "register")["stats"]["champion"] is False

    # 5. Up to date: the same inputs again register nothing new.
    again = _register(config, inputs, root, bleu=99.0, variant="filtered")
    assert again["version"] == other["version"]
    assert len(client.search_model_versions(f"name='{name}'")) == 4

    # 6. The champion loads and translates in-process, with a list or a one-column DataFrame.
    import mlflow
    import pandas as pd

    expected = translate_here(inputs, TEXTS, config.decode)
    mlflow.set_tracking_uri(config.tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    assert model.predict(TEXTS) == expected
    assert list(model.predict(pd.DataFrame({"text": TEXTS}))) == expected
    assert_params_change_decoding(model, inputs, config, expected)
    assert_model_carries_only_its_code(name, root)

    # 7. ... and in a fresh process, importing the code the model carries (code_paths).
    result = predict_in_a_fresh_process(config, name, root)
    assert result["out"] == expected
    assert f"{os.sep}code{os.sep}serving{os.sep}" in result["code"]

    # 8. `tfm translate`: stdin lines to stdout lines.
    assert_tfm_translate(config, name, expected)


def test_pip_requirements_are_pinned_and_installable() -> None:
    reqs = register.pip_requirements()
    assert [r.split("==")[0] for r in reqs] == ["torch", "sentencepiece", "numpy"]
    assert all("==" in r and "+" not in r for r in reqs)
    from corpora.pretokenize import Pretokenizer

    moses_bpe = Pretokenizer(
        ("en", "de"), moses=True, lowercase=True, bpe_codes="#version: 0.2\na b\n"
    )
    reqs = register.pip_requirements("torch", moses_bpe)
    assert [r.split("==")[0] for r in reqs] == [
        "torch",
        "sentencepiece",
        "numpy",
        "sacremoses",
        "subword-nmt",
    ]


def test_unknown_model_uri_is_a_clear_error(setup) -> None:
    config, _, _ = setup
    uri = "models:/no-such-model@champion"
    with pytest.raises(ModelNotFoundError, match="models:/no-such-model@champion"):
        from_registry(uri, config.tracking_uri)


def test_missing_metric_is_a_clear_error(setup, tmp_path) -> None:
    config, inputs, _ = setup
    score = finished_folder(
        tmp_path / "score",
        "score",
        {"x": 1},
        lambda tmp: (tmp / "scores.json").write_text(json.dumps({"chrf": 1.0})) and {},
    )
    with pytest.raises(StageError, match=r"scores\.json has no numeric 'bleu_sacre'"):
        run_stage(
            config.replace(workdir=str(tmp_path / "run")), "register", {**inputs, "score": score}
        )


def test_decide_champion_rules() -> None:
    from evaluation.champion import decide_champion

    new = {
        "bleu_sacre": 27.3,
        "test_set": "newstest2014",
        "test_variant": "full",
        "signature": SIGNATURE,
    }
    same = {
        "bleu_sacre": "27.3",
        "test_set": "newstest2014",
        "test_variant": "full",
        "signature": SIGNATURE,
    }
    assert decide_champion("bleu_sacre", new, None)[0] is True
    assert decide_champion("bleu_sacre", new, same)[0] is False  # a tie keeps the champion
    assert decide_champion("bleu_sacre", new, {**same, "bleu_sacre": "27.2"})[0] is True
    took, why = decide_champion("bleu_sacre", new, {**same, "signature": "other"})
    assert not took and "protocol differs" in why
    took, why = decide_champion("bleu_sacre", new, {**same, "bleu_sacre": "1.0", "pair": "en-fr"})
    assert not took and "protocol differs" in why
    # A metric's own signature wins over the generic one: tokenized BLEU has its own protocol.
    tok_new = {**new, "bleu_tok_compound": 28.0, "bleu_tok_compound_signature": "pretok:moses-de|a"}
    tok_old = {
        **same,
        "bleu_tok_compound": "27.0",
        "bleu_tok_compound_signature": "pretok:moses-de|b",
    }
    took, why = decide_champion("bleu_tok_compound", tok_new, tok_old)
    assert not took and "pretok:moses-de|b" in why
    tok_old["bleu_tok_compound_signature"] = "pretok:moses-de|a"
    assert decide_champion("bleu_tok_compound", tok_new, tok_old)[0] is True
    took, why = decide_champion(
        "bleu_sacre", new, {k: v for k, v in same.items() if k != "bleu_sacre"}
    )
    assert not took and "no bleu_sacre tag" in why


@contextlib.contextmanager
def mlflow_models_serve(model_uri: str, tracking_uri: str, folder: Path) -> Iterator[int]:
    """`mlflow models serve` (local env) of ``model_uri`` on a free port, until the block ends;
    its port once it answers ``/ping``."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # mlflow runs `uvicorn` by name: the environment's own scripts must come first on the PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PATH": path}
    log_path = folder / "serve.log"
    with open(log_path, "w") as log_file:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "models",
                "serve",
                "-m",
                model_uri,
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                "1",
            ],
            env=env,
            cwd=folder,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 180
        while True:
            assert server.poll() is None, log_path.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, (
                    "server did not start: " + log_path.read_text()[-3000:]
                )
                time.sleep(1)
        yield port
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def invoke(port: int, body: dict) -> list:
    """The served model's predictions for ``body`` (``inputs`` and maybe ``params``)."""
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=120).read())["predictions"]


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_translations(setup, tmp_path) -> None:
    """`mlflow models serve` (local env) on the registered model:
    {"inputs": [...]} -> predictions."""
    config, inputs, root = setup
    config = config.replace(
        workdir=str(tmp_path / "run"), register=RegisterConfig(model_name="served-translator")
    )
    record = _register(config, inputs, tmp_path, bleu=1.0)
    texts = [*TEXTS, ""]  # an empty line is served an empty translation
    expected = translate_here(inputs, texts, config.decode)
    assert expected[-1] == ""

    with mlflow_models_serve(record["model_uri"], config.tracking_uri, tmp_path) as port:
        assert invoke(port, {"inputs": texts}) == expected
        # Per-request decoding settings travel as params.
        short = translate_here(inputs, TEXTS, DecodeConfig(max_len_offset=1))
        assert invoke(port, {"inputs": TEXTS, "params": {"max_len_offset": 1}}) == short
        # ... the beam size too: three hypotheses each from a beam of three.
        wide = Translator.load(
            inputs["average"], inputs["tokenizer"], dataclasses.replace(config.decode, beam_size=3)
        ).translate_nbest(TEXTS, 3)
        served = invoke(port, {"inputs": TEXTS, "params": {"beam_size": 3, "n_best": 3}})
        assert [[h["translation"] for h in hyps] for hyps in served] == [
            [t for t, _ in hyps] for hyps in wide
        ]
        assert [h["score"] for hyps in served for h in hyps] == pytest.approx(
            [score for hyps in wide for _, score in hyps], abs=1e-5
        )


def test_a_ctranslate2_version_carries_its_export_and_serves_from_it(setup, tmp_path) -> None:
    import mlflow

    config, inputs, _ = setup
    decode = DecodeConfig(max_len_offset=6, engine="ctranslate2")
    config = config.replace(
        workdir=str(tmp_path / "run"),
        decode=decode,
        register=RegisterConfig(model_name="ct2-translator"),
    )
    record = _register(config, inputs, tmp_path, bleu=1.0)
    mlflow.set_tracking_uri(config.tracking_uri)  # the registry stage leaves the process's own
    local = Path(
        mlflow.artifacts.download_artifacts(record["model_uri"], dst_path=str(tmp_path / "dl"))
    )
    assert (local / "artifacts" / "ctranslate2" / "model.bin").is_file()
    assert "ctranslate2==" in (local / "requirements.txt").read_text()
    model = mlflow.pyfunc.load_model(record["model_uri"])
    reference = Translator.load(
        inputs["average"], inputs["tokenizer"], decode, export_dir=tmp_path / "ref"
    )
    assert model.predict(TEXTS) == reference.translate(TEXTS)

    # `tfm export` of that version, and of the checkpoint as a Hugging Face Marian folder.
    from pipelines.cli import main

    uri, tracking = record["model_uri"], config.tracking_uri
    out = tmp_path / "exported-ct2"
    assert (
        main(
            [
                "export",
                "--to",
                "ctranslate2",
                "--model",
                uri,
                "--tracking-uri",
                tracking,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    exported = Translator.load(inputs["average"], inputs["tokenizer"], decode, export_dir=out)
    assert exported.translate(TEXTS) == reference.translate(TEXTS)
    marian = tmp_path / "exported-marian"
    args = [
        "--checkpoint",
        str(inputs["average"]),
        "--tokenizer",
        str(inputs["tokenizer"]),
        "--out",
        str(marian),
    ]
    assert main(["export", "--to", "marian", *args]) == 0
    assert json.loads((marian / "config.json").read_text())["model_type"] == "marian"


REFS = tiny_sentences(60, seed=21)
SHIFTED_REFS = [s.replace("the", "a") for s in tiny_sentences(60, seed=22)]


def _dropped(texts: list[str], share: float, seed: int) -> list[str]:
    """``texts`` with the first word dropped from a ``share`` of them: a worse system's."""
    rng = random.Random(seed)
    return [" ".join(t.split()[1:]) if rng.random() < share else t for t in texts]


def _judged(root: Path, primary: list[str], shifted: list[str]) -> dict[str, Path]:
    """Score and evaluate folders of a model whose outputs are ``primary`` on the primary set
    and ``shifted`` on the shifted one, as the stages write them."""
    from evaluation.bleu import score_texts, write_sentences

    def score(tmp: Path) -> dict:
        result = {**score_texts(primary, REFS, "de"), "test_set": "synthetic", "pair": "en-de"}
        result["signature"] = result["bleu_sacre_signature"]
        (tmp / "scores.json").write_text(json.dumps(result))
        write_sentences(tmp / "sentences.tsv", REFS, REFS, primary, [0.0] * len(REFS))
        return {}

    def evaluate(tmp: Path) -> dict:
        folder = tmp / "sets" / "shifted"
        folder.mkdir(parents=True)
        (folder / "test.de").write_text("".join(r + "\n" for r in SHIFTED_REFS))
        (folder / "hyp.de").write_text("".join(h + "\n" for h in shifted))
        result = {**score_texts(shifted, SHIFTED_REFS, "de"), "test_set": "shifted"}
        (folder / "scores.json").write_text(json.dumps(result))
        return {}

    key = {"p": primary, "s": shifted}  # a fingerprint of their own
    return {
        "score": finished_folder(root / "score", "score", key, score),
        "evaluate": finished_folder(root / "evaluate", "evaluate", key, evaluate),
    }


@pytest.mark.slow
@pytest.mark.timeout(300)  # 3 registrations: about 40 s on 2 busy cores
def test_a_champion_by_evidence_kept_with_the_version(setup, tmp_path) -> None:
    """The evidence rule end to end through the registry: each version keeps its hypotheses
    and figures, and a candidate better on the primary set but worse on another is refused."""
    from mlflow.tracking import MlflowClient

    from tasks.framework.config_eval import EvalConfig, EvalSet

    base, inputs, _ = setup
    config = base.replace(
        workdir=str(tmp_path / "run"),
        register=RegisterConfig(model_name="evidence-translator"),
        eval=EvalConfig(
            test_sets=(
                EvalSet(name="synthetic"),
                EvalSet(name="shifted", prefix="x", holdout=False),
            )
        ),
    )
    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
    poor, good = _dropped(REFS, 0.8, seed=1), _dropped(REFS, 0.1, seed=2)
    fine = _dropped(SHIFTED_REFS, 0.1, seed=3)

    def register_(folder: str, primary: list[str], shifted: list[str]) -> dict:
        judged = _judged(tmp_path / folder, primary, shifted)
        out = run_stage(config, "register", {**inputs, **judged}).path
        return json.loads((out / "registered.json").read_text())

    first = register_("a", poor, fine)
    assert first["champion"] and first["decision"] == "no champion yet"
    tags = client.get_model_version("evidence-translator", "1").tags
    assert float(tags["eval.shifted.bleu_sacre"]) > float(tags["eval.synthetic.bleu_sacre"])

    # Better on the primary set, far worse on the shifted one: refused, and it says why.
    worse = register_("b", good, _dropped(SHIFTED_REFS, 0.9, seed=4))
    assert not worse["champion"] and worse["aliases"] == ["candidate"]
    assert "but significantly worse on shifted" in worse["decision"]
    primary_row, shifted_row = worse["evidence"]
    assert primary_row["set"] == "synthetic" and primary_row["difference"] > 0
    assert shifted_row["high"] < 0 and shifted_row["p_value"] < 0.05
    tags = client.get_model_version("evidence-translator", "2").tags
    assert tags["champion_decision"] == worse["decision"] and tags["evidence.against"] == "1"
    assert float(tags["evidence.shifted.p_value"]) < 0.05

    # Better on the primary set and the same on the other: promoted by its evidence.
    better = register_("c", good, fine)
    assert better["champion"] and better["aliases"] == ["candidate", "champion"]
    assert "better with p < 0.05; not significantly worse on shifted" in better["decision"]
    assert better["evidence"][1]["p_value"] == 1.0  # the same hypotheses on shifted
