"""The shape every weight adapter has: our state dict to another layout's and back.

As torchtitan's ``StateDictAdapter`` (its ``to_hf`` / ``from_hf``): an adapter is made for one
model's settings (its config, its vocabulary map), then converts whole state dicts, names and
tensors, without touching files. A layout we only import (fairseq) or only export to raises
``NotImplementedError`` for the other direction, saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["StateDictAdapter"]


@runtime_checkable
class StateDictAdapter(Protocol):
    """Weights between our ``Transformer``'s state dict (``model.state_dict()``'s names) and
    another toolkit's layout (its names, its row and column order)."""

    def from_ours(self, ours: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Our state dict as the other layout's (names and tensors)."""
        ...

    def to_ours(self, theirs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The other layout's weights as our state dict, ready for ``load_state_dict``."""
        ...
