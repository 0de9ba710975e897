"""docs/configuration.md lists exactly the environment variables the code reads: a variable added
to the code without its row, or a row left for a variable the code no longer reads, fails here."""

from __future__ import annotations

import re
from pathlib import Path

__all__: list[str] = []

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "configuration.md"

_NAME = r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*"
# NOTE: a name in quotes on a line that reads the environment: os.environ[...], env.get(...),
# the settings' typed readers `_float(env, "...")` and the like.
_READ = re.compile(rf"""(?:os\.environ|(?<![.\w])env\b|getenv)[^\n]*?["']({_NAME})["']""")
_ALSO_READ = re.compile(rf"""\(env, ["']({_NAME})["']""")


def read_by(paths: list[Path]) -> set[str]:
    """Every variable name the sources of `paths` read from the environment."""
    names: set[str] = set()
    for path in paths:
        for line in path.read_text().splitlines():
            names.update(_READ.findall(line))
            names.update(_ALSO_READ.findall(line))
    return names


def documented() -> set[str]:
    """The names in the first column of the page's `| variable | default | meaning |` tables."""
    names: set[str] = set()
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| variable |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not line.startswith("| ---"):
            names.update(re.findall(rf"`({_NAME})`", line.split("|")[1]))
    return names


def _sources(*tops: str) -> list[Path]:
    return [path for top in tops for path in sorted((REPO / top).rglob("*.py"))]


def test_the_reader_finds_what_the_settings_read() -> None:
    found = read_by([REPO / "jobqueue" / "core" / "settings.py", REPO / "jobqueue" / "core" / "logs.py",
                     REPO / "service" / "gunicorn_conf.py"])
    assert {"DATABASE_URL", "SA_STALE_AFTER", "SA_NOTIFY_INTERVAL", "LOG_LEVEL", "WEB_CONCURRENCY",
            "PROMETHEUS_MULTIPROC_DIR", "SA_DATABASE_POOLER"} <= found


def test_the_configuration_page_lists_every_variable_the_code_reads_and_no_other() -> None:
    code = read_by(_sources("jobqueue", "service", "sa_core"))
    # NOTE: the tests' and benchmarks' own servers are documented too; their other variables
    # (SA_REQUIRE_TEST_TOOLS, ...) belong to the harness, not to a deployment.
    harness = "\n".join(path.read_text() for path in _sources("tests", "bench"))
    code |= {name for name in ("SA_TEST_DATABASE_URL", "SA_BENCH_DATABASE_URL") if f'"{name}"' in harness}
    page = documented()
    assert sorted(code - page) == [], "read by the code, missing from docs/configuration.md"
    assert sorted(page - code) == [], "in docs/configuration.md, read by no code"
