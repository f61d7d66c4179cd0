"""The two numerics settings: ``train.precision`` as the autocast dtype on each device (a CUDA
device is only named: no GPU is needed to ask what it would compute in), and ``train.compile``
as what is compiled, eager with one warning where inductor would find no C++ compiler."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from training import numerics
from training.config import TrainConfig
from training.numerics import autocast_dtype, compiled_parts, cpp_compiler, loss_function
from transformer_core import Transformer, presets
from transformer_core.loss import label_smoothed_nll

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    ("precision", "device", "native", "dtype"),
    [
        ("auto", CUDA, False, torch.bfloat16),  # the default: as train.bf16's true was
        ("auto", CPU, True, None),  # as train.cpu_bf16's false was, whatever the CPU
        ("float32", CUDA, True, None),
        ("float32", CPU, True, None),
        ("bf16", CUDA, False, torch.bfloat16),
        ("bf16", CPU, True, torch.bfloat16),
    ],
)
def test_precision_is_the_autocast_dtype_on_each_device(
    monkeypatch, precision, device, native, dtype
):
    monkeypatch.setattr(numerics, "native_cpu_bf16", lambda: native)
    assert autocast_dtype(TrainConfig(precision=precision), device) is dtype


def test_the_default_config_computes_as_before_the_settings():
    default = TrainConfig()
    assert (default.precision, default.compile) == ("auto", ())
    assert autocast_dtype(default, CUDA) is torch.bfloat16
    assert autocast_dtype(default, CPU) is None
    assert compiled_parts(default, CPU) == ()


def test_bf16_on_a_cpu_without_native_bf16_warns_once_and_computes_in_float32(monkeypatch, caplog):
    monkeypatch.setattr(numerics, "native_cpu_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="training.numerics"):
        assert autocast_dtype(TrainConfig(precision="bf16"), CPU) is None
    assert [r.getMessage() for r in caplog.records] == [
        "train.precision: bf16: this CPU has no native bf16 (AVX512-BF16 or AMX): float32"
    ]


@pytest.fixture
def no_compiler(monkeypatch, tmp_path) -> Iterator[Path]:
    """No C++ compiler to find: an empty folder as the PATH (given), and inductor's candidates
    as an unset CXX leaves them (its config reads CXX once, at torch's import)."""
    from torch._inductor import config as inductor

    monkeypatch.setenv("PATH", str(tmp_path))
    with inductor.patch({"cpp.cxx": (None, "g++")}):
        yield tmp_path


def test_cpp_compiler_follows_inductor_candidates_on_the_path(no_compiler: Path):
    from torch._inductor import config as inductor

    assert cpp_compiler() is None
    fake = no_compiler / "my-g++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with inductor.patch({"cpp.cxx": (None, "my-g++")}):  # as CXX=my-g++ at torch's import
        assert cpp_compiler() == str(fake)


@pytest.mark.parametrize(
    ("compile", "eager"), [(("loss",), "the loss runs"), (("model",), "the model and the loss run")]
)
def test_compile_without_a_cpp_compiler_warns_once_and_runs_eagerly(
    no_compiler, caplog, compile, eager
):
    config = TrainConfig(compile=compile)
    with caplog.at_level(logging.WARNING, logger="training.numerics"):
        parts = compiled_parts(config, CPU)
    assert parts == ()
    assert [r.getMessage() for r in caplog.records] == [
        f"train.compile: [{compile[0]}]: no C++ compiler (g++, or the one $CXX names) on this "
        f"machine: {eager} eagerly"
    ]
    module = Transformer(presets.debug(), 12)
    assert loss_function(config, module, CPU, None, parts) is label_smoothed_nll  # not compiled
    # A GPU's kernels are Triton's: its compile does not wait on a C++ compiler.
    assert compiled_parts(config, CUDA) == compile


def test_compile_with_a_cpp_compiler_compiles_what_it_names(monkeypatch):
    monkeypatch.setattr(numerics, "cpp_compiler", lambda: "/usr/bin/g++")
    config = TrainConfig(compile=("loss",))
    assert compiled_parts(config, CPU) == ("loss",)
    module = Transformer(presets.debug(), 12)
    loss = loss_function(config, module, CPU, None, ("loss",))
    assert loss is not label_smoothed_nll  # torch.compile's wrapper; compiled at the first call
