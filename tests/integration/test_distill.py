"""The distill pipeline on a tiny synthetic config, with a registered teacher: the whole flow
under Prefect's test harness (every stage, the student registered with its teacher's version,
a second run skipping everything), a teacher version that does not exist, a new champion, and
the distill stage resuming after a SIGKILL and after a translator's death without translating
a written shard again. Real Ray, Prefect, MLflow (SQLite), sentencepiece and CTranslate2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.flow_configs import DISTILL_STAGES, distill_config, ran, write_config
from helpers.teachers import TEACHER, register_teacher

# Slow (two trainings and three teacher translations; minutes on 2 busy cores): `make test-slow`.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """A SQLite registry holding the teacher's version 1 (the champion), without the weights'
    sha256 tag: the teacher stage downloads the weights to hash them."""
    return register_teacher(tmp_path_factory.mktemp("registry"))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, registry, harness, ray_local):
    from pipelines.flows import Loaded, pipeline_flow
    from tasks.framework.config import load_config

    workdir = tmp_path_factory.mktemp("distill")
    path = write_config(workdir / "distill.yaml", distill_config(workdir, registry))
    return path, pipeline_flow(config_path=path, loaded=Loaded(load_config(path)))


def test_every_stage_runs_and_the_student_is_registered_with_its_teachers_version(
    first_run, registry
):
    from mlflow import MlflowClient

    from tasks.framework.config import load_config
    from transformer_core import checkpoint
    from transformer_core.folders import sha256_file

    path, outcomes = first_run
    assert ran(outcomes) == DISTILL_STAGES
    stats = {r.stage: r.stats for r in outcomes}
    assert stats["teacher"]["found_by"] == f"models:/{TEACHER}@champion"
    assert (stats["teacher"]["name"], stats["teacher"]["version"]) == (TEACHER, 1)
    assert stats["distill"]["sentences"] == 400 and stats["distill"]["shards"] == 4
    # The teacher's worst 5% of its non-empty translations are dropped.
    kept = stats["filter"]["input"] - stats["filter"]["dropped"]["empty"]
    assert stats["filter"]["dropped"]["worst"] == int(0.05 * kept) > 0
    assert stats["filter"]["kept"] == kept - stats["filter"]["dropped"]["worst"]
    root = load_config(path).root
    student = checkpoint.load(root / "average" / "model.pt")["config"]
    assert (student["n_layers"], student["decoder_layers"]) == (2, 1)
    export = json.loads((root / "export" / "ctranslate2" / "export.json").read_text())
    assert export["quantization"] == "int8" and (root / "export/ctranslate2/model.bin").is_file()

    client = MlflowClient(tracking_uri=registry, registry_uri=registry)
    version = client.get_model_version_by_alias("distilltest", "champion")
    assert version.tags["teacher.name"] == TEACHER and version.tags["teacher.version"] == "1"
    assert version.tags["teacher.model_uri"] == f"models:/{TEACHER}/1"
    assert version.tags["teacher.weights_sha256"] == stats["teacher"]["weights_sha256"]
    assert version.tags["weights_sha256"] == sha256_file(root / "average" / "model.pt")
    assert stats["register"]["teacher"] == f"models:/{TEACHER}/1"


def test_a_second_run_skips_every_stage(first_run):
    from pipelines.flows import pipeline_flow

    path, _ = first_run
    assert ran(pipeline_flow(config_path=path)) == []


def test_a_teacher_version_that_does_not_exist_is_one_line_naming_it(first_run, capsys):
    from pipelines.cli import main

    path, _ = first_run
    missing = f"models:/{TEACHER}/7"
    code = main(["stage", "teacher", "--config", path, "--set", f"distill.teacher={missing}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("tfm: stage teacher failed: distill.teacher models:/flowtest/7")
    assert "has no version 7" in err[0] and "(its versions: 1)" in err[0]


def resume_config(tmp_path: Path, registry: str) -> str:
    """Twenty shards of twenty sentences, each decoded slowly enough (beam 4, up to 40 pieces
    past the source, on a random model that never stops early) to be killed between two."""
    changes = {
        "name": "distillresume",
        "distill.teacher": f"models:/{TEACHER}/1",
        "distill.rows_per_shard": 20,
        "distill.decode": {"beam_size": 4, "max_len_offset": 40},
    }
    return write_config(tmp_path / "resume.yaml", distill_config(tmp_path, registry, **changes))


def upstream(path: str):
    """The config, with the distill stage's inputs built."""
    from tasks.framework.config import load_config
    from tasks.framework.runner import run_stage

    config = load_config(path)
    for stage in ("teacher", "download", "clean"):
        run_stage(config, stage)
    return config


def shards(config) -> dict[str, object]:
    """The distill stage's output, shard by shard, as rows."""
    import pyarrow.parquet as pq

    folder = config.root / "distill" / "train"
    return {f.name: pq.read_table(f).to_pylist() for f in sorted(folder.glob("part-*.parquet"))}


def test_the_distill_stage_resumes_after_a_sigkill_without_translating_a_shard_again(
    registry, ray_local, tmp_path
):
    from tasks.framework.runner import run_stage

    path = resume_config(tmp_path, registry)
    config = upstream(path)
    command = [sys.executable, "-m", "pipelines.cli", "stage", "distill", "--config", path]
    killed = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    kept = config.root / "cache" / "distill"
    deadline = time.time() + 300
    while not list(kept.glob("*/part-*.parquet")):
        assert killed.poll() is None and time.time() < deadline, "no shard was written"
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)  # the command and its group; its watchdog ends Ray
    killed.wait()
    written = {f.name: os.stat(f) for f in kept.glob("*/part-*.parquet")}
    assert 0 < len(written) < 20, "the stage ended before it was killed"

    stats = run_stage(config, "distill").stats
    assert (stats["shards_reused"], stats["shards_translated"]) == (len(written), 20 - len(written))
    for name, before in written.items():  # the same files: hard links, never written again
        after = os.stat(config.root / "distill" / "train" / name)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    resumed = shards(config)
    assert not list(kept.iterdir())  # the shards now live in the stage's folder only
    uninterrupted = run_stage(config, "distill", force=True)
    assert uninterrupted.stats["shards_reused"] == 0
    assert shards(config) == resumed


def test_a_killed_translators_batches_are_redone_and_the_run_goes_on(registry, ray_local, tmp_path):
    import psutil

    from tasks.framework.runner import run_stage

    config = upstream(resume_config(tmp_path, registry))
    done: dict[str, object] = {}
    run = threading.Thread(target=lambda: done.update(result=run_stage(config, "distill")))
    run.start()
    kept = config.root / "cache" / "distill"
    while not list(kept.glob("*/part-*.parquet")):
        assert run.is_alive(), "the stage ended before a translator was killed"
        time.sleep(0.05)
    # The pool's actor process (a descendant of this driver's local Ray).
    [actor] = [
        p
        for p in psutil.Process().children(recursive=True)
        if "CorpusTranslator" in " ".join(p.cmdline())
    ]
    actor.kill()
    run.join()
    stats = done["result"].stats
    assert stats["restarts"] == 1 and stats["shards_reused"] == 0
    redone = shards(config)
    assert sum(len(rows) for rows in redone.values()) == 400
    assert run_stage(config, "distill", force=True).stats["restarts"] == 0
    assert shards(config) == redone  # as a run that no death interrupted


def test_a_new_champion_makes_the_teacher_and_everything_after_it_stale(first_run, registry):
    """Last: it moves the alias. The new version is found at the flow's first stage, by
    version and weights: the teacher stage is stale and every stage after it waits."""
    from tasks.framework.config import load_config
    from tasks.framework.runner import status

    path, _ = first_run
    register_teacher(Path(registry.removeprefix("sqlite:///")).parent.parent, seed=1)
    rows = dict(status(load_config(path)))
    assert rows["teacher"].state == "stale"
    assert rows["teacher"].reason == "config changed (version, weights_sha256)"
    assert rows["download"].up_to_date and rows["clean"].up_to_date
    assert rows["distill"].reason == "waits for teacher"
