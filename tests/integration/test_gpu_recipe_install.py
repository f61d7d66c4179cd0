"""`make gpu-recipe`'s offline install (``--site``): a venv over the running Python's packages
(a venv made from a venv Python, as on the GPU machines), the archive's packages in it, and
``tfm`` running this checkout. No GPU needed: the install comes before any CUDA work."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_recipe  # noqa: E402


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.slow  # a virtual environment made and installed into: ~18 s
def test_site_archive_installs_beside_the_python_s_own_packages(tmp_path):
    site = _archive(tmp_path / "site.tar.xz", {"./bundled_pkg/__init__.py": b"VALUE = 41.02\n"})
    venv = tmp_path / "venv"
    seconds = gpu_recipe.install(venv, None, str(site))
    assert seconds > 0
    python = str(venv / "bin" / "python")
    # the archive's package, and torch and Ray from the Python that made the venv
    probe = "import bundled_pkg, torch, ray; print(bundled_pkg.VALUE, torch.__file__)"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "41.02"
    assert not out.stdout.split()[1].startswith(str(venv))
    tfm = subprocess.run(
        [str(venv / "bin" / "tfm"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert tfm.returncode == 0 and "Prefect + Ray + MLflow" in tfm.stdout, tfm.stderr
    assert gpu_recipe.install(venv, None, str(site)) == 0.0  # present: nothing done again


def test_unsafe_site_archive_is_refused_in_one_line(tmp_path):
    site = _archive(tmp_path / "evil.tar.xz", {"../escaped.py": b"x = 1\n"})
    with pytest.raises(SystemExit) as stop:
        gpu_recipe.install(tmp_path / "venv", None, str(site))
    message = str(stop.value)
    assert message.startswith(f"gpu-recipe: --site {site}:") and "\n" not in message
    assert not list(tmp_path.rglob("escaped.py"))
