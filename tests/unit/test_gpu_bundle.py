"""benchmarks/gpu_bundle.py: which resolved packages an offline GPU machine is sent, and what is
left out of them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_bundle  # noqa: E402


def _report(*pairs: tuple[str, str]) -> dict:
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in pairs]}


def test_select_sends_what_the_machine_lacks_never_its_torch():
    report = _report(
        ("attention-pipeline", "0.2.0"),
        ("torch", "2.10.0"),
        ("nvidia-cublas-cu12", "12.8.4.1"),
        ("triton", "3.6.0"),
        ("prefect", "3.9.1"),
        ("Ray", "2.60.0"),
        ("numpy", "2.4.6"),
        ("protobuf", "7.36.2"),
        ("typing_extensions", "4.16.0"),
    )
    have = {"numpy", "protobuf", "typing-extensions", "torch"}
    chosen = gpu_bundle.select(report, have, also={"protobuf"}, project="attention_pipeline")
    # numpy and typing_extensions are there; protobuf goes anyway (also); torch's stack never
    assert chosen == ["prefect==3.9.1", "protobuf==7.36.2", "Ray==2.60.0"]


def test_read_have_takes_freeze_lines_and_plain_names(tmp_path):
    have = tmp_path / "have.txt"
    have.write_text(
        "# pip list --format=freeze\nPyYAML==6.0.2\ntyping_extensions==4.15\n"
        "mypkg @ file:///src/mypkg\nsentencepiece\n\nzope.interface>=6\n",
        encoding="utf-8",
    )
    assert gpu_bundle.read_have(have) == {
        "pyyaml",
        "typing-extensions",
        "mypkg",
        "sentencepiece",
        "zope-interface",
    }


def test_prune_leaves_out_what_a_run_never_loads(tmp_path):
    site = tmp_path / "site"
    keep = [
        "ray/__init__.py",
        "ray/train/__init__.py",
        "mlflow/server/__init__.py",
        "ray/dashboard/client/build/index.html",
    ]
    drop = [
        "bin/tfm",
        "ray/jars/ray_dist.jar",
        "ray/rllib/algo.py",
        "mlflow/server/js/build/a.js",
        "ray/__pycache__/x.cpython-312.pyc",
        "ray/dashboard/client/build/static/js/m.js.map",
        "virtualenv/__init__.py",
        "virtualenv-21.0.dist-info/METADATA",
    ]
    for rel in keep + drop:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"x" * 1000)
    freed = gpu_bundle.prune(site)
    assert all((site / rel).is_file() for rel in keep)
    assert not any((site / rel).exists() for rel in drop)
    assert freed == 1000 * len(drop)
