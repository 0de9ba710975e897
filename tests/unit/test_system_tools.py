"""A test that needs a system tool never installs it: it skips naming the command that does, and
fails instead where SA_REQUIRE_TEST_TOOLS=1 (.ci/run, which installs them all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REQUIRE_TOOLS, require, require_tool

__all__: list[str] = []


def test_a_missing_tool_skips_naming_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.delenv(REQUIRE_TOOLS, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception,
                       match=r"^`promtool` is not installed \(apt-get install prometheus\)$"):
        require_tool("promtool", install="apt-get install prometheus")


def test_where_tools_are_required_a_missing_one_fails_the_test(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS, "1")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="apt-get install pgbouncer"):
        require_tool("pgbouncer", install="apt-get install pgbouncer")
    with pytest.raises(pytest.fail.Exception, match="network namespaces need root"):
        require("network namespaces need root", "run the tests as root")


def test_a_tool_on_the_path_is_returned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tool = tmp_path / "promtool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_tool("promtool", install="apt-get install prometheus") == str(tool)
    require(None, "nothing is missing")
