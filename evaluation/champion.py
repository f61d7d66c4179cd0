"""Which registered version is the champion: the policy behind the registry's aliases.

A new version takes the ``champion`` alias only when its metric beats the champion's on the same
test set under the same protocol (test set, variant, language pair, the metric's signature);
scores measured under another protocol are never compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["PROTOCOL_KEYS", "decide_champion", "protocol"]

PROTOCOL_KEYS = ("test_set", "test_variant", "pair", "signature")
"""What must match before two scores may be compared."""


def protocol(scores: Mapping[str, Any], metric: str) -> dict[str, str]:
    """The test set, variant, pair and the metric's own signature (``<metric>_signature``, else
    ``signature``), as strings. Works on scores.json and on a version's tags alike."""
    signature = scores.get(f"{metric}_signature", scores.get("signature", ""))
    return {
        "test_set": str(scores.get("test_set", "")),
        "test_variant": str(scores.get("test_variant", "")),
        "pair": str(scores.get("pair", "")),
        "signature": str(signature),
    }


def decide_champion(
    metric: str,
    new_scores: Mapping[str, Any],
    champion_tags: Mapping[str, str] | None,
) -> tuple[bool, str]:
    """(take the champion alias?, why). Strictly better on the same protocol wins; a champion
    measured under another protocol (or without the metric), or a new version without it, is
    kept and never compared."""
    if champion_tags is None:
        return True, "no champion yet"
    if metric not in new_scores:  # an imported model, scored by nobody yet
        return False, f"not compared: this version has no {metric}; champion kept"
    new_protocol = protocol(new_scores, metric)
    old_protocol = protocol(champion_tags, metric)
    if new_protocol != old_protocol:
        diff = {
            k: (old_protocol[k], new_protocol[k])
            for k in PROTOCOL_KEYS
            if old_protocol[k] != new_protocol[k]
        }
        return False, f"not compared: protocol differs from the champion's ({diff}); champion kept"
    try:
        old = float(champion_tags[metric])
    except (KeyError, ValueError):
        return False, f"not compared: the champion has no {metric} tag; champion kept"
    new = float(new_scores[metric])
    if new > old:
        return True, f"{metric} {new:.4g} beats the champion's {old:.4g}"
    return False, f"{metric} {new:.4g} does not beat the champion's {old:.4g}; champion kept"
