"""The code's shape as rules that fail: the import contracts of docs/contracts.md (import-linter,
configured in pyproject.toml) and the size limits on production code."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers.code_size import MAX_FUNCTION_LINES, MAX_MODULE_LINES, long_functions, module_lines

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = tuple(PYPROJECT["tool"]["importlinter"]["root_packages"])
"""The project's packages, from their one list (pyproject.toml's [tool.importlinter])."""
DATA_TABLES = {
    # word lists and inflection tables of the synthetic English-German grammar
    "corpora/synthetic_lexicon.py",
}


def production_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the packages under ``root`` (first on the path), with our contracts."""
    script = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_logo=True, cache_dir=None))"
    )
    return subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)


CYCLES_SCRIPT = """
import sys
import grimp
graph = grimp.build_graph(*sys.argv[1:], exclude_type_checking_imports=False)
for module in sorted(graph.modules):
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
        back = graph.find_shortest_chain(importer=imported, imported=module)
        if back:
            print(" -> ".join((module, *back)))
"""


def import_cycles(root: Path) -> list[str]:
    """Every file-level import cycle among the packages under ``root`` (first on the path), one
    line each, found by grimp (import-linter's graph): every import statement of a file counts,
    under ``if TYPE_CHECKING:`` and inside functions too."""
    done = subprocess.run(
        [sys.executable, "-c", CYCLES_SCRIPT, *PACKAGES], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_no_file_imports_itself_through_others():
    """No module is on an import cycle, ``TYPE_CHECKING`` imports included: a name two files
    share lives below both (import-linter's acyclic contract sees only the cycles between the
    siblings of a package, not those through the package's own ``__init__``)."""
    assert import_cycles(ROOT) == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        (
            "serving/ct2_options.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import serving.ct2\n",
        ),
        ("serving/__init__.py", "def engine():\n    from serving.ct2 import CTranslate2Engine\n"),
    ],
)
def test_the_cycle_check_sees_type_checking_and_package_imports(tmp_path, module, source):
    for package in PACKAGES:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    target = tmp_path / module
    target.write_text(target.read_text() + source)
    name = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert any(line.startswith(f"{name} -> ") for line in import_cycles(tmp_path))


def test_the_package_list_is_the_one_every_tool_uses():
    """The wheel's packages (setuptools' discovery), the type checker's files (Pyrefly's
    globs) and the code fingerprint's packages are the importlinter roots, each of which has
    a place in the layers: adding a package is one edit there (and its place in the layers)."""
    from setuptools.config.pyprojecttoml import read_configuration

    from tasks.framework.code_fingerprint import project_packages

    wheel = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in wheel} == set(PACKAGES)
    assert project_packages() == PACKAGES
    layered = {
        p.strip()
        for c in PYPROJECT["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers"
        for layer in c["layers"]
        for p in layer.split("|")
    }
    assert set(PACKAGES) <= layered
    pyrefly = Path(sys.executable).with_name("pyrefly")
    if not pyrefly.exists():
        pytest.skip("pyrefly is not installed (the dev extra)")
    dump = subprocess.run(
        [str(pyrefly), "dump-config", "--max-files", "all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    covered = {
        Path(line.strip()).relative_to(ROOT)
        for line in dump.stdout.split("Covered files:", 1)[1].splitlines()
        if line.strip().endswith(".py")
    }
    assert covered == {p.relative_to(ROOT) for p in production_modules()}


def test_import_contracts_hold():
    """Layers, forbidden runtimes per package, and no import cycles inside a package."""
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "source", "contract"),
    [
        ("transformer_core/_probe.py", "import tasks.framework.graph\n", "Layers"),
        ("transformer_core/_probe.py", "import ray\n", "The model library"),
        ("serving/_probe.py", "import prefect\n", "Prefect"),
        ("serving/ct2.py", "import serving.translator\n", "No import cycles"),
        (
            "serving/decode_config.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import serving.ct2\n",
            "No import cycles",
        ),
        ("tasks/framework/graph.py", "import tasks.clean\n", "No import cycles"),
    ],
)
def test_import_contracts_catch_a_broken_rule(tmp_path, module, source, contract):
    """The contracts are live: a copy of the code with one bad import breaks the named one."""
    for package in PACKAGES:
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / package, tmp_path / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    target = tmp_path / module
    target.write_text((target.read_text() if target.exists() else "") + source)
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, done.stdout


@pytest.mark.parametrize("path", production_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_production_functions_and_modules_stay_small(path: Path):
    rel = str(path.relative_to(ROOT))
    long = long_functions(path.read_text(encoding="utf-8"), MAX_FUNCTION_LINES)
    assert not long, f"{rel}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
    if rel not in DATA_TABLES:
        lines = module_lines(path)
        assert lines <= MAX_MODULE_LINES, f"{rel}: {lines} lines (limit {MAX_MODULE_LINES})"


def test_no_benchmark_script_shadows_a_package():
    """``python benchmarks/x.py`` puts benchmarks/ first on sys.path: a benchmarks/parsing.py
    made ``import parsing`` find the script, and every benchmark that imports the translator
    failed."""
    root = Path(__file__).resolve().parents[2]
    packages = {p.parent.name for p in root.glob("*/__init__.py")}
    scripts = {p.stem for p in (root / "benchmarks").glob("*.py")}
    assert not scripts & packages


def test_the_top_level_of_tasks_holds_only_stages_and_none_runs_itself():
    """``tasks/`` holds the stages, ``tasks/framework/`` what runs them: every module at the top
    level is a stage of a pipeline that says what it builds (``stage_config``, ``build``) and
    leaves running it to the runner (no ``run``, no import of the runner)."""
    from tasks.framework.graph import PIPELINES, stage_module

    stages = {s.name for pipeline in PIPELINES.values() for s in pipeline}
    assert {p.stem for p in (ROOT / "tasks").glob("*.py")} - {"__init__"} == stages
    for name in sorted(stages):
        module = stage_module(name)
        assert callable(module.stage_config) and callable(module.build), name
        assert not hasattr(module, "run"), name
        tree = ast.parse((ROOT / "tasks" / f"{name}.py").read_text(encoding="utf-8"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "tasks.framework.runner" not in imported, name


def test_tracking_lives_in_its_one_package():
    """Experiment tracking is one room: no production module named ``tracking*`` outside the
    ``tracking`` package (two ``tracking.py`` and a ``tracking_send.py`` beside a
    ``tracking_sender.py`` once told a reader nothing)."""
    outside = [
        str(p.relative_to(ROOT))
        for p in production_modules()
        if p.stem.startswith("tracking") and p.parent != ROOT / "tracking"
    ]
    assert outside == []
    assert (ROOT / "tracking" / "__init__.py").is_file()


SEAM_PACKAGE = "filesystem"
"""Where files live: the one package that asks what kind of place a path or URI names."""
STORE_SEAM = {
    "tasks/framework/workdir.py",  # the work dir seam and its local side
    "tasks/framework/workdir_store.py",  # the work dir seam's object-store side
    "tasks/framework/workdir_place.py",  # what a config's workdir names: its kind, node folder
}
"""Beside the seam package, the modules that may ask which kind of store a work dir is on
(``is_remote``): nowhere else says ``if remote:`` (a choice between two kinds is a seam with two
implementations). None of them reads a scheme itself: that is the seam package's alone."""
URL_CLIENTS = {
    "corpora/fetch.py": "a download's URL: http(s), or a file:// mirror; not a place to store in",
}
"""Modules that read a URL's scheme for what they fetch, not for where files live."""
FILESYSTEM_SCHEMES = ("s3", "gs", "gcs", "file", "memory", "hdfs", "az", "abfs", "abfss")


def _in_seam(rel: str) -> bool:
    return rel.split("/", 1)[0] == SEAM_PACKAGE


def _names_a_scheme(node: ast.AST) -> bool:
    """A string constant (or a tuple, list or set of them) holding ``://`` or a filesystem's
    scheme (``"s3"``, ``"file://"``...)."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_scheme(e) for e in node.elts)
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    return "://" in node.value or node.value in FILESYSTEM_SCHEMES


STRING_TESTS = {"startswith", "endswith", "partition", "rpartition", "split", "rsplit", "find"}
STRING_TESTS |= {"rfind", "index", "rindex", "count", "removeprefix"}


def store_kind_tests(tree: ast.Module) -> list[int]:
    """Lines of ``tree`` that ask a store's kind: ``is_remote(...)`` or ``<x>.remote``."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "is_remote":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "remote":
            # Ray's ``f.remote(...)`` and ``ray.remote`` are calls or decorators, not the kind
            if id(node) not in called and not (
                isinstance(node.value, ast.Name) and node.value.id == "ray"
            ):
                lines.append(node.lineno)
    return lines


def scheme_tests(tree: ast.Module) -> list[int]:
    """Lines of ``tree`` that test a path's scheme: a comparison with (or ``in``) a string that
    holds ``://`` or names a filesystem's scheme (``"://" in path``, ``scheme == "file"``,
    ``parts.scheme in ("s3", "gs")``), or a string method given one (``uri.startswith("s3://")``,
    ``path.partition("://")``). Messages that name a URI's form test nothing and pass; so does
    asking whether a tracking URI is an http(s) server's."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            parts = node.args if node.func.attr in STRING_TESTS else []
        else:
            continue
        if any(_names_a_scheme(p) for p in parts):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_store_kind_test_outside_the_work_dir_seam():
    """Which kind of store a work dir is on (a local folder, an object store) is asked only in
    the seam package and the work dir's own modules (``STORE_SEAM``); everyone else is handed
    the work dir object."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in production_modules()
        if not _in_seam(rel := str(path.relative_to(ROOT))) and rel not in STORE_SEAM
        for line in store_kind_tests(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == []


def scheme_tests_outside_the_seam(root: Path) -> list[str]:
    """``path:line`` of each scheme test in the packages under ``root``, outside ``filesystem/``
    (and the URL clients)."""
    modules = sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))
    return [
        f"{path.relative_to(root)}:{line}"
        for path in modules
        if not _in_seam(rel := path.relative_to(root).as_posix()) and rel not in URL_CLIENTS
        for line in scheme_tests(ast.parse(path.read_text(encoding="utf-8")))
    ]


def test_no_scheme_test_outside_the_filesystem_package():
    """What kind of place a path or URI names is read in ``filesystem/`` alone: every other
    module is handed a ``Location``, a ``Store`` or a ``StoredFolder`` and asks it."""
    assert scheme_tests_outside_the_seam(ROOT) == []


def test_the_store_kind_check_sees_each_form():
    """The check above can fail: each way of asking the kind is caught, ``ray.remote`` is not."""
    source = "is_remote(w)\nconfig.store.remote\nray.remote(f)\nactor.append.remote(x)\n"
    assert store_kind_tests(ast.parse(source)) == [1, 2]


def test_the_scheme_check_sees_each_form_and_passes_messages():
    source = (
        'if "://" in path: pass\n'
        "uri.startswith('s3://')\n"
        "scheme == 'gs'\n"
        "parts.scheme in ('s3', 'gs')\n"
        'head, _, rest = where.partition("://")\n'
        "'file://' not in url\n"
        'raise ValueError(f"{uri}: use s3://bucket/prefix")\n'
        "parts.scheme in ('http', 'https')\n"
        "name == 'shard'\n"
    )
    assert scheme_tests(ast.parse(source)) == [1, 2, 3, 4, 5, 6]


def test_a_planted_scheme_test_outside_the_seam_fails_the_rule(tmp_path):
    """A library that tests ``"://" in path`` again (as ``training/data.py`` once did) fails the
    rule; the same line inside ``filesystem/`` does not."""
    planted = 'def open_fs(path):\n    return "://" in path\n'
    for module in ("training/data.py", "filesystem/location.py", "corpora/fetch.py"):
        (tmp_path / module).parent.mkdir()
        (tmp_path / module).write_text(planted)
    assert scheme_tests_outside_the_seam(tmp_path) == ["training/data.py:2"]


ENVIRON_WRITERS = {
    "pipelines/environment.py",  # a tfm process, at its start
    "training/process_group.py",  # a Ray Train worker: its rank's rendezvous
}
"""The one module per process kind that writes ``os.environ`` (STYLE: settings are passed)."""
ENVIRON_SETTERS = {"putenv", "unsetenv", "_enable_token_auth"}
"""Calls that write the environment: ``os``'s, and Ray's switch for token authentication."""


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def environ_writes(tree: ast.Module) -> list[int]:
    """Lines that write the environment: ``os.environ[k] = v``, ``del os.environ[k]``, its
    ``update``/``setdefault``/``pop``/``clear``, ``putenv``, and known setters' calls."""
    lines = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign | ast.Delete)
            else [node.target]
            if isinstance(node, ast.AugAssign)
            else []
        )
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            owner = node.func.value if isinstance(node.func, ast.Attribute) else None
            mutators = ("update", "setdefault", "pop", "popitem", "clear")
            if (name in mutators and _is_environ(owner)) or name in ENVIRON_SETTERS:
                lines.append(node.lineno)
    return lines


def import_time_environ_reads(tree: ast.Module) -> list[int]:
    """Lines that read the environment when the module is imported (outside any function)."""
    lines = []
    follow: list[ast.AST] = list(tree.body)
    while follow:
        node = follow.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if _is_environ(node) or (isinstance(node, ast.Attribute) and node.attr == "getenv"):
            lines.append(node.lineno)
        follow.extend(ast.iter_child_nodes(node))
    return sorted(lines)


def test_the_environment_is_written_in_one_module_per_process_kind_and_never_read_at_import():
    writes, reads = [], []
    for path in production_modules():
        name, tree = str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))
        if name not in ENVIRON_WRITERS:
            writes += [f"{name}:{line}" for line in environ_writes(tree)]
        reads += [f"{name}:{line}" for line in import_time_environ_reads(tree)]
    assert writes == [] and reads == []


def test_the_environment_checks_see_each_form():
    """The checks above can fail: each way of writing is caught, a read in a function is not."""
    source = (
        "os.environ['A'] = '1'\ndel os.environ['A']\nos.environ.update(x)\n"
        "os.environ.setdefault('A', '1')\nos.environ.pop('A')\nos.putenv('A', '1')\n"
        "_enable_token_auth()\nos.environ.get('A')\nx = {}.pop('A')\n"
    )
    assert environ_writes(ast.parse(source)) == [1, 2, 3, 4, 5, 6, 7]
    at_import = "A = os.environ.get('A')\ndef f():\n    return os.getenv('B')\nB = os.getenv('C')\n"
    assert import_time_environ_reads(ast.parse(at_import)) == [1, 4]


def test_test_modules_have_names_of_their_own():
    """pytest imports each test file by its basename (the folders are no packages): two files of
    one name in different folders stop the whole suite at collection."""
    names = sorted(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert sorted({n for n in names if names.count(n) > 1}) == []
