"""Which registered version is the champion: the policy behind the registry's aliases.

Two rules (``register.rule``). Both compare only under the same protocol (test set, variant,
language pair, the metric's signature); scores measured under another are never compared.

- ``evidence``: a candidate takes the ``champion`` alias when it is better than the champion on
  the primary test set by sacreBLEU's paired bootstrap with p below ``register.max_p``, and
  significantly worse on none of the other sets both were judged on (the same references),
  each compared on the champion's stored hypotheses (``evaluation.evidence``).
- ``higher``: its metric is higher than the champion's on the primary set (one figure, no
  interval).

A champion with no stored hypotheses for the primary set (registered before they were kept)
is judged by the higher figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evaluation.evidence import SetOutputs, tag_name

__all__ = [
    "PROTOCOL_KEYS",
    "Decision",
    "Rule",
    "against_parent",
    "choose",
    "decide_by_evidence",
    "decide_champion",
    "protocol",
]

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


@dataclass(frozen=True)
class Decision:
    """Whether the candidate takes the champion alias, why in one line, and each compared set's
    figures (``evaluation.compare.MetricComparison.as_dict`` with its ``set``), primary first."""

    take: bool
    reason: str
    sets: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Each compared set's figures, a line each."""
        return [row_line(row) for row in self.sets]

    def tags(self, against: str | None) -> dict[str, str]:
        """The decision as a version's tags: ``champion_decision`` and, compared with the
        champion's version ``against`` (``evidence.against``), each set's
        ``evidence.<set>.difference`` / ``low`` / ``high`` / ``p_value``."""
        tags = {"champion_decision": self.reason}
        if self.sets and against is not None:
            tags["evidence.against"] = against
        return {**tags, **row_tags("evidence", self.sets)}


def row_line(row: Mapping[str, Any]) -> str:
    """One compared set's figures: ``test2016: bleu_sacre 31.20 against 30.00, +1.20 [...]``."""
    return (
        f"{row['set']}: {row['metric']} {row['a']:.2f} against {row['b']:.2f}, "
        f"{row['difference']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}], "
        f"p = {row['p_value']:.3f}"
    )


def row_tags(prefix: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each compared set's ``<prefix>.<set>.difference`` / ``low`` / ``high`` / ``p_value``."""
    return {
        f"{prefix}.{tag_name(row['set'])}.{k}": f"{row[k]:.4f}"
        for row in rows
        for k in ("difference", "low", "high", "p_value")
    }


def decide_by_evidence(
    metric: str,
    primary: str,
    candidate: Mapping[str, SetOutputs],
    champion: Mapping[str, tuple[str, list[str]]],
    lang: str,
    max_p: float,
) -> Decision | None:
    """The evidence rule: the candidate's hypotheses against the champion's (set name ->
    (references' sha256, hypotheses), ``evaluation.evidence.read_evidence``) on every set both
    have with the same references. None when the champion has none for the primary set: there
    is no evidence to decide by."""
    common = _common_sets(candidate, champion)
    if primary not in common:
        return None
    names = [primary, *(n for n in common if n != primary)]
    rows = _paired(metric, names, candidate, champion, lang)
    first, others = rows[0], rows[1:]
    worse = [r for r in others if r["difference"] < 0 and r["p_value"] < max_p]
    better = first["difference"] > 0 and first["p_value"] < max_p
    head = f"{metric} on {primary} {_difference(first)}"
    if not better:
        why = f"{head}: not better with p < {max_p:g} (register.max_p); champion kept"
    elif worse:
        listed = "; ".join(f"{r['set']} {_difference(r)}" for r in worse)
        why = f"{head}, but significantly worse on {listed}; champion kept"
    else:
        rest = ", ".join(r["set"] for r in others) or "no other set"
        why = f"{head}, better with p < {max_p:g}; not significantly worse on {rest}"
    missing = sorted(set(candidate) - set(names))
    if missing:
        why += f" (not compared, the champion has no hypotheses on: {', '.join(missing)})"
    return Decision(better and not worse, why, rows)


def against_parent(
    metric: str,
    candidate: Mapping[str, SetOutputs],
    parent: Mapping[str, tuple[str, list[str]]],
    lang: str,
) -> list[dict[str, Any]]:
    """A fine-tuned model against its parent's stored hypotheses (``read_evidence``) on every
    set both were judged on, found by the references' sha256 (a child may name the parent's set
    otherwise), by the paired bootstrap: what it gained on a set of the new domain, what it forgot
    on one of the parent's. Rows carry the candidate's set names; none decides anything."""
    by_refs = {refs: hyps for refs, hyps in parent.values()}
    matched = {n: s for n, s in candidate.items() if s.refs_sha256 in by_refs}
    stored = {n: (s.refs_sha256, by_refs[s.refs_sha256]) for n, s in matched.items()}
    return _paired(metric, sorted(matched), matched, stored, lang)


def _common_sets(
    candidate: Mapping[str, SetOutputs], stored: Mapping[str, tuple[str, list[str]]]
) -> list[str]:
    """The sets both have, with the same references (their sha256), sorted by name."""
    return sorted(n for n in candidate if n in stored and stored[n][0] == candidate[n].refs_sha256)


def _paired(
    metric: str,
    names: Sequence[str],
    candidate: Mapping[str, SetOutputs],
    stored: Mapping[str, tuple[str, list[str]]],
    lang: str,
) -> list[dict[str, Any]]:
    """Each named set's paired comparison, the candidate as ``a`` and the stored as ``b``."""
    from evaluation.compare import compare_systems

    rows: list[dict[str, Any]] = []
    for name in names:
        outputs = candidate[name]
        (row,) = compare_systems(
            outputs.refs, outputs.hyps, stored[name][1], lang, metrics=[metric]
        )
        rows.append({"set": name, **row.as_dict()})
    return rows


def _difference(row: Mapping[str, Any]) -> str:
    """``+1.23 [+0.40, +2.01], p = 0.004 (31.2 against the champion's 30.0)``."""
    return (
        f"{row['difference']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}], "
        f"p = {row['p_value']:.3f} ({row['a']:.2f} against the champion's {row['b']:.2f})"
    )


@dataclass(frozen=True)
class Rule:
    """How the champion is chosen (``register``'s settings)."""

    metric: str
    rule: str = "evidence"
    """``evidence`` or ``higher`` (the module's docstring)."""
    max_p: float = 0.05
    primary: str = ""
    """The primary test set's name."""

    def wants_evidence(
        self, scores: Mapping[str, Any], champion_tags: Mapping[str, str] | None
    ) -> bool:
        """Whether the champion's hypotheses are needed: the evidence rule, and a champion whose
        figure was measured under the candidate's protocol."""
        return (
            self.rule == "evidence"
            and champion_tags is not None
            and self.metric in scores
            and protocol(scores, self.metric) == protocol(champion_tags, self.metric)
        )


def choose(
    rule: Rule,
    scores: Mapping[str, Any],
    champion_tags: Mapping[str, str] | None,
    evidence: Sequence[SetOutputs],
    stored: Mapping[str, tuple[str, list[str]]] | None,
    lang: str,
    *,
    same_weights: bool = False,
) -> Decision:
    """The candidate (its ``scores`` and ``evidence``) against the champion (its tags and its
    ``stored`` hypotheses, ``evaluation.evidence.read_evidence``; None: none kept). The evidence
    rule falls back to the higher figure where the champion kept none on the primary set; there
    the champion's own weights registered again (``same_weights``) take the alias at an equal
    figure, so that a champion registered before hypotheses were kept gets them."""
    take, reason = decide_champion(rule.metric, scores, champion_tags)
    if not rule.wants_evidence(scores, champion_tags):
        return Decision(take, reason)
    assert champion_tags is not None  # wants_evidence: there is a champion
    if stored is not None:
        by_name = {s.name: s for s in evidence}
        decided = decide_by_evidence(rule.metric, rule.primary, by_name, stored, lang, rule.max_p)
        if decided is not None:
            return decided
    if (
        not take
        and same_weights
        and _figure(champion_tags, rule.metric) == _figure(scores, rule.metric)
    ):
        take, reason = True, "the champion's own weights, registered again"
    return Decision(
        take, f"{reason} (by the higher figure: {_no_evidence(rule, evidence, stored)})"
    )


def _no_evidence(
    rule: Rule,
    evidence: Sequence[SetOutputs],
    stored: Mapping[str, tuple[str, list[str]]] | None,
) -> str:
    """Why the primary set could not be compared by the paired test."""
    if not any(s.name == rule.primary for s in evidence):
        return f"this version has no hypotheses on {rule.primary}"
    if stored is None or rule.primary not in stored:
        return f"the champion kept no hypotheses on {rule.primary}"
    return f"the champion's hypotheses on {rule.primary} are of other references"


def _figure(values: Mapping[str, Any], metric: str) -> float | None:
    """``values[metric]`` as a number (a tag holds a string), None where there is none."""
    try:
        return float(values[metric])
    except (KeyError, TypeError, ValueError):
        return None
