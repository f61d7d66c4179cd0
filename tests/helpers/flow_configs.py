"""The whole WMT14 flow's tiny synthetic config, which the flow tests and the object-store
flow tests run, and which stages a flow ran."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from helpers.stage_folders import TINY_TRAINING

DISTILL_STAGES = [
    "teacher",
    "download",
    "clean",
    "distill",
    "filter",
    "tokenizer",
    "shard",
    "train",
    "average",
    "translate",
    "score",
    "export",
    "register",
]
WMT14_STAGES = [
    "download",
    "clean",
    "tokenizer",
    "shard",
    "train",
    "average",
    "translate",
    "score",
    "register",
]
SECRET = "Flow-Pa55-9kq"
"""The password of a mirror URL in every tiny config: synthetic data downloads nothing, but the
URL travels with the config into manifests, MLflow and Prefect, where it must arrive masked."""
MIRROR = f"http://flowuser:{SECRET}@127.0.0.1:9/"


def tiny_config(workdir: Path, **overrides) -> dict:
    config = copy.deepcopy(
        {
            "name": "flowtest",
            "seed": 7,
            "workdir": str(workdir / "{name}"),
            "data": {
                "source": "synthetic",
                "synthetic_train": 400,
                "synthetic_dev": 30,
                "synthetic_test": 30,
                "mirror": MIRROR,
            },
            "tokenizer": {"kind": "bpe", "vocab_size": 300, "sample_size": 1000, "threads": 1},
            "shard": {"rows_per_shard": 200, "num_actors": 1, "cpus_per_actor": 0.5},
            **TINY_TRAINING,
            "decode": {"beam_size": 2, "max_len_offset": 5},
            "register": {"model_name": "flowtest"},
            "ray": {"num_cpus": 2},
        }
    )
    return with_overrides(config, overrides)


def distill_config(workdir: Path, tracking_uri: str, **overrides) -> dict:
    """A tiny distill pipeline's config: ``tiny_config``'s corpus, the teacher ``flowtest`` (the
    tiny flow's model) found by its champion alias in ``tracking_uri``, 100-sentence shards, and
    a student with a deeper encoder than decoder, registered as ``distilltest``."""
    config = tiny_config(workdir, **{"name": "distilltest", "register.model_name": "distilltest"})
    config["distill"] = {"teacher": "models:/flowtest@champion", "rows_per_shard": 100}
    config["model"] = {**config["model"], "n_layers": 2, "decoder_layers": 1}
    config["decode"] = {"beam_size": 1, "max_len_offset": 5}
    config["mlflow"] = {"tracking_uri": tracking_uri, "experiment": "distillation"}
    return with_overrides(config, overrides)


def with_overrides(config: dict, overrides: dict) -> dict:
    """``config`` with each ``a.b.c`` key of ``overrides`` set in its nested sections."""
    for dotted, value in overrides.items():
        node = config
        *parents, last = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return config


def ran(results) -> list[str]:
    return [r.stage for r in results if r.ran]


def write_config(path: Path, config: dict) -> str:
    """``config`` as the YAML file ``path``; its path, for ``tfm run``."""
    path.write_text(yaml.safe_dump(config))
    return str(path)
