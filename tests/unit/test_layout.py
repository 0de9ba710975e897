"""The rooms of the code import one way: service -> jobqueue; inside jobqueue, core imports no
other room, schema and engine only core, runtime only engine and core; devtools sits on them, and
operator (the command line) on top of everything; the web imports neither operator nor devtools.
Read from the source with ast, so an import added anywhere (even inside a function) counts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

__all__: list[str] = []

REPO = Path(__file__).resolve().parents[2]

ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "schema": {"core", "schema"},
    "engine": {"core", "engine"},
    "runtime": {"core", "engine", "runtime"},
    "devtools": {"core", "schema", "engine", "runtime", "devtools"},
    "operator": {"core", "schema", "engine", "runtime", "devtools", "operator"},
}
"""Which rooms of jobqueue/ each room may import (see docs/architecture.md)."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved."""
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            # NOTE: `from jobqueue import operator` imports a room by its name, not its module.
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def _sources(top: str) -> list[Path]:
    return sorted((REPO / top).rglob("*.py"))


def test_the_rooms_exist() -> None:
    rooms = {p.name for p in (REPO / "jobqueue").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(ALLOWED), "a new room needs its line in ALLOWED and in docs/architecture.md"


@pytest.mark.parametrize("path", _sources("jobqueue"), ids=lambda p: str(p.relative_to(REPO)))
def test_jobqueue_imports_run_one_way(path: Path) -> None:
    room = path.relative_to(REPO / "jobqueue").parts[0]
    for module in _imports(path):
        top, _, rest = module.partition(".")
        assert top != "service", f"{path.name} imports {module}: jobqueue never imports the web"
        assert top != "falcon", f"{path.name} imports falcon: HTTP stays in service/"
        if top == "jobqueue" and rest:
            target = rest.split(".")[0]
            if room in ALLOWED:
                assert target in ALLOWED[room], f"{room}/{path.name} imports {module}"


WEB_NEVER_IMPORTS = ("jobqueue.operator", "jobqueue.devtools")
"""Rooms the web reads nothing from: the command line and the developer's tools sit on top of the
queue, beside the web; the web reads through the engine or core (docs/architecture.md)."""


def _reaches(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


@pytest.mark.parametrize("path", _sources("service"), ids=lambda p: str(p.relative_to(REPO)))
def test_the_web_never_imports_the_operator_or_the_devtools(path: Path) -> None:
    found = sorted(m for m in _imports(path) if _reaches(m, WEB_NEVER_IMPORTS))
    assert not found, f"{path.relative_to(REPO)} imports {found}: read through jobqueue.engine or core"


def test_a_web_import_of_the_operator_is_caught() -> None:
    assert _reaches("jobqueue.operator.inspection", WEB_NEVER_IMPORTS)
    assert _reaches("jobqueue.devtools", WEB_NEVER_IMPORTS)
    assert not _reaches("jobqueue.operators_note", WEB_NEVER_IMPORTS)
    assert not _reaches("jobqueue.engine.inspection", WEB_NEVER_IMPORTS)
    assert "jobqueue.engine.inspection" in _imports(REPO / "service" / "resources" / "ops.py")
    # NOTE: a module imported by name from its package counts as that module.
    assert "jobqueue.engine.chains" in _imports(REPO / "jobqueue" / "engine" / "control.py")


def test_an_upward_import_is_caught() -> None:
    source = REPO / "jobqueue" / "core" / "states.py"
    assert "jobqueue.core.policy" not in _imports(source)
    assert _imports(REPO / "jobqueue" / "engine" / "claim.py") & {"jobqueue.core.queries.job",
                                                                  "jobqueue.core.queries"}


def _leaning(modules: set[str]) -> list[str]:
    """The imported modules that are a conftest or a test module (`test_*`), at any depth."""
    return sorted(m for m in modules
                  if m.rsplit(".", 1)[-1] == "conftest" or m.rsplit(".", 1)[-1].startswith("test_"))


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    """Helpers (functions, classes) live in helper modules such as tests/helpers.py, fixtures in
    tests/conftest.py: a test module that another imports runs twice (once as pytest collects it)
    and ties the two together."""
    leaning = {str(path.relative_to(REPO)): found for top in ("tests", "bench", "docs")
               for path in _sources(top) if (found := _leaning(_imports(path)))}
    assert leaning == {}, "move these to tests/helpers.py (or another helper module): " + str(leaning)


def test_an_import_of_a_test_module_or_a_conftest_is_caught() -> None:
    assert _leaning({"tests.conftest", "tests.test_sse", "conftest", "tests.unit.test_states",
                     "tests.helpers", "tests.sse_client", "jobqueue.core.states"}) == [
        "conftest", "tests.conftest", "tests.test_sse", "tests.unit.test_states"]
    assert _leaning(_imports(REPO / "tests" / "unit" / "test_layout.py")) == []


def _statement_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "jobqueue" / "core" / "queries").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


@pytest.mark.parametrize("doc", ["README.md", "ops/README.md",
                                 *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_the_docs_cite_files_the_repository_has(doc: str) -> None:
    text = (REPO / doc).read_text()
    cited = set(re.findall(r"(?<![\w./-])((?:jobqueue|service|sql|tests|docs|ops|bench)/[\w./@-]*\w)",
                           text))
    # NOTE: `NNNN_name.sql` is the migrations' naming pattern, not a file.
    missing = sorted(path for path in cited
                     if not (REPO / path).exists() and "NNNN" not in path)
    assert not missing, f"{doc} cites files the repository does not have: {missing}"
    assert "DESIGN.md" not in text


def test_the_architecture_names_statements_that_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([A-Z][A-Z_]+[A-Z])(?:_\*)?`", text))
    statements = _statement_names()
    prefixes = {name for name in named if f"`{name}_*`" in text}
    unknown = sorted(name for name in named - prefixes
                     if name.startswith(("JOB_", "PROMPT_", "IDEMPOTENCY_", "ORG_", "MAINTENANCE_",
                                         "MISSION_", "TOKEN_")) and name not in statements)
    assert not unknown, f"docs/architecture.md names statements that do not exist: {unknown}"
    assert all(any(s.startswith(p) for s in statements) for p in prefixes), prefixes


MAX_MODULE_LINES = 500
"""No product module is longer: one job each (issue 23)."""


@pytest.mark.parametrize("path", [p for top in ("jobqueue", "service", "sa_core")
                                  for p in _sources(top)], ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_longer_than_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    name = str(path.relative_to(REPO))
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines: split it by job"
