"""Checkpoint averaging: the mean of the weights, dtype kept, mismatches named."""

import pytest
import torch

from transformer_core import presets
from transformer_core.averaging import average_checkpoints
from transformer_core.checkpoint import CheckpointError, save


def _save(path, state):
    return save(path, state, presets.debug(), vocab_size=10)


def test_identical_checkpoints_average_to_themselves(tmp_path):
    from transformer_core.model import Transformer

    torch.manual_seed(0)
    model = Transformer(presets.debug(), 40)
    paths = [_save(tmp_path / f"{i}.pt", model.state_dict()) for i in range(3)]
    avg = average_checkpoints(paths)
    assert avg.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(avg[key], value, rtol=1e-6, atol=1e-7)
    # Tied weights stay one tensor, so the model still loads and stays tied.
    assert avg["src_embed.weight"] is avg["generator.weight"]
    model.load_state_dict(avg)


def test_known_tensors_average_to_their_mean(tmp_path):
    a = {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[0.0]])}
    b = {"w": torch.tensor([3.0, 4.0, 8.0]), "b": torch.tensor([[1.0]])}
    c = {"w": torch.tensor([2.0, 0.0, 1.0]), "b": torch.tensor([[2.0]])}
    paths = [_save(tmp_path / f"{n}.pt", s) for n, s in zip("abc", (a, b, c), strict=True)]
    avg = average_checkpoints(paths)
    torch.testing.assert_close(avg["w"], torch.tensor([2.0, 2.0, 4.0]))
    torch.testing.assert_close(avg["b"], torch.tensor([[1.0]]))


def test_bare_state_dicts_accepted(tmp_path):
    for i in range(2):
        torch.save({"w": torch.full((2,), float(i))}, tmp_path / f"{i}.pt")
    avg = average_checkpoints([tmp_path / "0.pt", tmp_path / "1.pt"])
    torch.testing.assert_close(avg["w"], torch.full((2,), 0.5))


def test_bf16_stays_bf16_and_accumulates_in_float32(tmp_path):
    # 256 + 1 is not representable in bf16 (8 bits of mantissa); a bf16 running sum loses the 1s.
    values = [256.0] + [1.0] * 7
    paths = [
        _save(tmp_path / f"{i}.pt", {"w": torch.tensor([v], dtype=torch.bfloat16)})
        for i, v in enumerate(values)
    ]
    avg = average_checkpoints(paths)
    assert avg["w"].dtype == torch.bfloat16
    assert avg["w"].item() == pytest.approx(sum(values) / len(values), rel=1e-2)


def test_integer_tensors_must_agree(tmp_path):
    p1 = _save(tmp_path / "1.pt", {"w": torch.ones(2), "n": torch.tensor(3)})
    p2 = _save(tmp_path / "2.pt", {"w": torch.ones(2), "n": torch.tensor(3)})
    p3 = _save(tmp_path / "3.pt", {"w": torch.ones(2), "n": torch.tensor(4)})
    assert average_checkpoints([p1, p2])["n"].item() == 3
    with pytest.raises(CheckpointError, match="'n'"):
        average_checkpoints([p1, p3])


def test_mismatched_keys_name_key_and_files(tmp_path):
    p1 = _save(tmp_path / "one.pt", {"w": torch.ones(2), "extra": torch.ones(1)})
    p2 = _save(tmp_path / "two.pt", {"w": torch.ones(2)})
    with pytest.raises(CheckpointError, match="'extra'") as info:
        average_checkpoints([p1, p2])
    assert "one.pt" in str(info.value) and "two.pt" in str(info.value)
    with pytest.raises(CheckpointError, match="'extra'") as info:
        average_checkpoints([p2, p1])
    assert "one.pt" in str(info.value) and "two.pt" in str(info.value)


def test_mismatched_shapes_name_key_and_files(tmp_path):
    p1 = _save(tmp_path / "one.pt", {"w": torch.ones(2, 3)})
    p2 = _save(tmp_path / "two.pt", {"w": torch.ones(3, 2)})
    with pytest.raises(CheckpointError, match=r"'w'.*\(2, 3\) in .*one\.pt.*\(3, 2\) in .*two\.pt"):
        average_checkpoints([p1, p2])


def test_no_paths_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError, match="gone.pt"):
        average_checkpoints([tmp_path / "gone.pt"])
