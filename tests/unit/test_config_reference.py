"""The config reference of `make lint` (.ci/config_reference.py): docs/config.md lists every key
of every section with its type, default and docstring, and the check fails, in one line, when the
committed page is out of date or a field has no docstring."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import pytest
from annotated_types import Ge, Gt, Le, Lt
from markdown_it import MarkdownIt
from pydantic import AfterValidator

from tasks.framework.config import RunConfig
from tasks.framework.config_sections import is_setting
from transformer_core import presets

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "config_reference", ROOT / ".ci" / "config_reference.py"
)
assert _spec is not None and _spec.loader is not None
config_reference = importlib.util.module_from_spec(_spec)
sys.modules["config_reference"] = config_reference
_spec.loader.exec_module(config_reference)

STALE = "docs/config.md is out of date: run .venv/bin/python .ci/config_reference.py --write\n"


def every_key(cls: type, prefix: str = "") -> dict[str, str | None]:
    """Every dotted key under ``cls``, walked here by ``dataclasses.fields`` alone: the heading
    of the section it holds (a dataclass, one that may be null, or a list of them: ``key[]``),
    else None."""
    keys: dict[str, str | None] = {}
    hints = typing.get_type_hints(cls)
    for f in filter(is_setting, dataclasses.fields(cls)):
        kinds = [h for h in (hints[f.name], *typing.get_args(hints[f.name])) if h is not None]
        section = next((h for h in kinds if dataclasses.is_dataclass(h)), None)
        listed = typing.get_origin(hints[f.name]) is tuple
        heading = f"{prefix}{f.name}{'[]' if listed else ''}"
        keys[f"{prefix}{f.name}"] = heading if section is not None else None
        if section is not None:
            keys.update(every_key(section, f"{heading}."))
    return keys


@pytest.fixture(scope="module")
def page() -> str:
    return config_reference.render(RunConfig)


@pytest.fixture(scope="module")
def rows() -> dict[str, object]:
    return {r.key: r for s in config_reference.sections(RunConfig) for r in s.rows}


def test_the_page_lists_every_key_of_every_section(page: str):
    keys = every_key(RunConfig)
    assert len(keys) > 150 and "train.steps" in keys and "storage.cache_dir" in keys
    assert [k for k in keys if f"| `{k}` |" not in page] == []
    sections = [heading for heading in keys.values() if heading]
    assert len(sections) == 22
    assert [k for k in sections if f"\n## `{k}`\n" not in page] == []


def test_a_section_that_may_be_null_says_so_and_has_its_own_table(page: str):
    assert (
        "| `distill.decode` | section [`distill.decode`](#distilldecode) or `null` | `null` |"
        in (page)
    )
    assert "| `distill.decode.beam_size` | `int` | `4` |" in page


def test_the_model_section_takes_a_preset_and_lists_them_all(page: str):
    assert '| `model.preset` | `"debug" \\| "base" \\|' in page
    names = [*presets.PRESETS, *(f"table3:{r}" for r in presets.TABLE3_ROWS)]
    assert all(f"| `{name}` |" in page for name in names)
    assert "| `big` | Transformer (big)" in page
    assert "`d_model: 1024`, `d_ff: 4096`, `n_heads: 16`, `dropout: 0.3`" in page


@pytest.mark.parametrize(
    ("key", "kind", "default"),
    [
        ("data.test_variant", '`"full" | "filtered"`', '`"full"`'),  # Literal
        ("average.last", "`int >= 1`", "`5`"),  # Annotated[int, Ge(1)]
        ("mlflow.probe_seconds", "`float > 0`", "`2.0`"),  # Gt
        ("ray.address", "`str | null`", "`null`"),  # optional
        ("parsing.evalb_max_error", "`int >= 0 | null`", "`10`"),  # bounded, optional
        ("train.adam_betas", "`[float, float]`", "`[0.9, 0.98]`"),  # a pair
        ("train.num_workers", "`int | [int, int]`", "`1`"),  # one or a range
        ("data.corpora", "`list of str`", "`[]`"),  # tuple[str, ...]
        ("workdir", "`str`", '`"runs/{name}"`'),  # an alias of str
        ("name", "`str`", "—"),  # no default in the class
        ("decode.beam_size", "`int`", "`4`"),  # inherited from BeamSettings
    ],
)
def test_types_and_defaults_read_as_yaml(rows: dict, key: str, kind: str, default: str):
    assert (rows[key].type, rows[key].default) == (kind, default)


def test_inherited_fields_keep_their_docstrings_and_a_validator_says_what_it_checks(rows: dict):
    assert rows["decode.beam_size"].meaning == "Beam width."  # BeamSettings' docstring
    assert rows["parsing.beam_size"].meaning.startswith("Beam width for parsing")  # overridden
    assert rows["register.metric"].type.startswith("`str`: one of the metrics the score stage")
    assert rows["parsing.train_files"].type.startswith("`list of str`: each a glob relative")
    assert rows["train"].type == "section [`train`](#train)"


def test_every_table_row_has_four_cells_and_no_html(page: str):
    tokens = MarkdownIt("commonmark").enable("table").parse(page)
    blocks = [t.content for t in tokens if t.type == "html_block"]
    assert len(blocks) == 1 and blocks[0].startswith("<!-- Written by")  # the one comment
    inline_html = [
        c.content
        for t in tokens
        if t.type == "inline"
        for c in t.children or []
        if "html" in c.type
    ]
    assert inline_html == []
    cells, widths = 0, []
    for token in tokens:
        if token.type == "tr_open":
            cells = 0
        elif token.type in ("td_open", "th_open"):
            cells += 1
        elif token.type == "tr_close":
            widths.append(cells)
    assert len(widths) > 150 and set(widths) <= {3, 4}


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@pytest.mark.parametrize(
    ("hint", "text"),
    [
        (Annotated[float, Ge(0), Lt(1)], "float >= 0 < 1"),
        (Annotated[int, Gt(0), Le(8)], "int > 0 <= 8"),
        (Literal["a", 1, True, None], '"a" | 1 | true | null'),
        (Colour, '"red" | "blue"'),
        (tuple[int, ...] | None, "list of int | null"),
    ],
)
def test_type_text(hint: object, text: str):
    assert config_reference.type_text(hint) == (text, [])


def test_a_type_it_cannot_read_is_an_error():
    with pytest.raises(TypeError, match="cannot render the type"):
        config_reference.type_text(dict[str, int])


def _checked(value: str) -> str:
    return value


def _documented(value: str) -> str:
    """Checked somehow."""
    return value


@dataclass(frozen=True, kw_only=True)
class Base:
    """A base section."""

    inherited: int = 1
    """Documented in the base."""


@dataclass(frozen=True, kw_only=True)
class Inner(Base):
    """A section."""

    documented: Annotated[str, AfterValidator(_documented)] = "x"
    """Has one."""
    bare: str = "y"
    checked: Annotated[str, AfterValidator(_checked)] = "z"
    """Has one, but its validator has none."""


@dataclass(frozen=True, kw_only=True)
class Outer:
    """The root."""

    inner: Inner = field(default_factory=Inner)
    """The section."""


@dataclass(frozen=True, kw_only=True)
class Sound:
    """The root."""

    inner: Base = field(default_factory=Base)
    """The section."""


def test_a_field_without_a_docstring_fails():
    with pytest.raises(config_reference.Undocumented) as caught:
        config_reference.render(Outer)
    here = "tests/unit/test_config_reference.py"
    assert [line.split(":", 2)[::2] for line in caught.value.lines] == [
        [here, " Inner.bare has no docstring"],
        [here, " validator _checked has no docstring"],
    ]
    assert "| `inner.inherited` | `int` | `1` | Documented in the base. |" in (
        config_reference.render(Sound)
    )


def test_the_check_fails_in_one_line_on_a_missing_docstring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(config_reference, "RunConfig", Outer)
    assert config_reference.main([]) == 1
    assert capsys.readouterr().out.splitlines()[0].endswith(": Inner.bare has no docstring")


def test_the_committed_page_is_current(capsys: pytest.CaptureFixture[str]):
    assert config_reference.main([]) == 0, capsys.readouterr().out


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A repository whose docs/config.md is current."""
    (tmp_path / "docs").mkdir()
    page = config_reference.render(RunConfig)
    (tmp_path / "docs" / "config.md").write_text(page, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "plant",
    [
        lambda text: text.replace("`1234`", "`4321`"),  # a default changed by hand
        lambda text: text.replace("| `train.steps` |", "| `train.step` |"),
        lambda text: text + "\nA note added by hand.\n",
        lambda text: None,  # no page at all
    ],
)
def test_an_out_of_date_page_fails_the_check_in_one_line(
    copy: Path, plant, capsys: pytest.CaptureFixture[str]
):
    page = copy / "docs" / "config.md"
    assert config_reference.main(["--root", str(copy)]) == 0
    text = plant(page.read_text(encoding="utf-8"))
    if text is None:
        page.unlink()
    else:
        page.write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert config_reference.main(["--root", str(copy)]) == 1
    assert capsys.readouterr().out == STALE


def test_write_brings_the_page_up_to_date(copy: Path, capsys: pytest.CaptureFixture[str]):
    page = copy / "docs" / "config.md"
    page.write_text("stale\n", encoding="utf-8")
    assert config_reference.main(["--root", str(copy), "--write"]) == 0
    assert page.read_text(encoding="utf-8") == config_reference.render(RunConfig)
    assert config_reference.main(["--root", str(copy)]) == 0
