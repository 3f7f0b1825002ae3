"""tools/audit_mutations.py: every mutation still applies to the current source (its code found
exactly once, its tests present), and a run with one that does not fails before mutating anything.

The audit itself runs the tests once per mutation (minutes); this check takes a second, so it is
the part that runs with the suite: code that moved makes it fail, naming the mutation to re-key."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).parents[2] / "tools"


@pytest.fixture()
def audit(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("audit_mutations", TOOLS / "audit_mutations.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "audit_mutations", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_mutation_applies_to_the_current_source(audit) -> None:
    assert audit.problems() == []
    assert audit.main(["--check"]) == 0


@pytest.mark.parametrize(
    "change, says",
    [
        pytest.param({"old": "code that is nowhere"}, "occurs 0 times in", id="code-moved"),
        pytest.param({"old": "return"}, "times in", id="code-not-unique"),
        pytest.param({"file": "reader/no_such_module.py"}, "does not exist", id="file-gone"),
        pytest.param(
            {"tests": ("tests/reader/plan/test_assign.py::test_no_such_test",)}, "does not exist", id="test-gone"
        ),
    ],
)
def test_a_mutation_that_does_not_apply_fails_the_run_naming_it(audit, monkeypatch, capsys, change, says) -> None:
    stale = dataclasses.replace(audit.MUTATIONS[0], id="M99", **change)
    monkeypatch.setattr(audit, "MUTATIONS", (*audit.MUTATIONS, stale))

    ran: list[str] = []

    def run(m, **kwargs):
        ran.append(m.id)
        return {"id": m.id, "outcome": "caught"}

    monkeypatch.setattr(audit, "run", run)
    assert audit.main([]) == 2  # the whole run: refused before anything is mutated
    err = capsys.readouterr().err
    assert "M99: " in err and says in err
    assert "M01" not in err  # only the stale one is named
    assert ran == []
    assert audit.main(["--check"]) == 2
    assert audit.main(["M01"]) == 0  # a run of others still goes: the check covers what is chosen
    assert ran == ["M01"]


def test_an_unknown_mutation_id_is_an_error(audit, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        audit.main(["M999"])
    assert exited.value.code == 2
    assert "M999" in capsys.readouterr().err
