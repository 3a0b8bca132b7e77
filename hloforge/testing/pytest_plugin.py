"""`pytest --hloforge-gate`: one test item per gate case of every registered layer, loss and optimizer.

Registered as the `pytest11` entry point `hloforge`, so it is active wherever
hloforge is installed — including a third-party plugin package's own tree,
where `pytest --hloforge-gate` gates that package's plugins next to ours. The
items need no test file: they are appended to the session's items at
collection time, before `-k`/`-m` deselection sees them, so `-k conv2d`
narrows the gate like any other test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hloforge.testing.gate import CaseError, GateCase, GateResult

OPTION = "--hloforge-gate"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hloforge")
    group.addoption(OPTION, action="store_true", default=False,
                    help="gate every registered hloforge layer, loss and optimizer plugin against its oracles "
                         "(jax.vjp of its reference, finite differences, optax)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hloforge_gate: a gate case added by --hloforge-gate")


class GateFailure(Exception):
    def __init__(self, result: GateResult):
        super().__init__(result.row())
        self.result = result


class PluginFault(Exception):
    """A plugin's gate case could not be built or run: reported as its one line, not a traceback."""


class CaseErrorItem(pytest.Item):
    """A plugin whose gate cases cannot be built (`gate.CaseError`): one failing item, so the other
    plugins are still collected and gated."""

    def __init__(self, *, error: CaseError, **kw: Any):
        super().__init__(**kw)
        self.error = error
        self.add_marker("hloforge_gate")
        self.extra_keyword_matches.update({error.kind, error.name, error.distribution})

    def runtest(self) -> None:
        raise PluginFault(self.error.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class GateItem(pytest.Item):
    """Runs one `GateCase`; fails with its row (errors against tolerances) when the gate is red."""

    def __init__(self, *, case: GateCase, **kw: Any):
        super().__init__(**kw)
        self.case = case
        self.add_marker("hloforge_gate")
        self.extra_keyword_matches.update({case.kind, case.name, case.distribution})

    def runtest(self) -> None:
        from hloforge.testing.gate import require_oracles

        require_oracles([self.case])  # a missing jax or optax is this install's, no plugin's fault
        try:
            result = self.case.run()
        except Exception as e:  # the plugin's fault, said in one line (as `hloforge verify` says it)
            from hloforge.testing.gate import fault, plugin_label

            c = self.case
            who = plugin_label(c.kind, c.name, c.distribution)
            raise PluginFault(f"{who} {fault(e, f'on {c.id}', who)}") from e
        self.user_properties.append(("gate_row", result.row()))
        if not result.passed:
            raise GateFailure(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, GateFailure):
            from hloforge.testing import gate

            return "\n".join([
                f"gate failed for {self.case.kind} {self.case.name!r} from distribution {self.case.distribution!r}",
                f"tolerances: jax f64 ≤ {gate.tolerances(self.case.kind)[0]:g}, fd f64 ≤ {gate.TOL_FD_F64:g}, "
                f"jax f32 ≤ {gate.tolerances(self.case.kind)[1]:g}",
                gate.HEADER,
                excinfo.value.result.row(),
            ])
        from hloforge.core.errors import HloforgeError

        if isinstance(excinfo.value, (PluginFault, HloforgeError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


def item_name(case: GateCase) -> str:
    return f"gate[{case.id}]"


class GateCollector(pytest.Collector):
    """The `hloforge-gate` node: its children are the registry's gate cases."""

    def collect(self) -> list[pytest.Item]:
        from hloforge.testing.gate import collect_cases

        seen: dict[str, int] = {}
        out: list[pytest.Item] = []
        cases, errors = collect_cases()
        for case in cases:
            name = item_name(case)
            seen[name] = seen.get(name, 0) + 1
            if seen[name] > 1:  # two identical cases: keep both, distinguishable
                name = f"{name}#{seen[name]}"
            out.append(GateItem.from_parent(self, name=name, case=case))
        # A plugin whose cases cannot be built fails on its own; the others' items are still collected.
        out += [CaseErrorItem.from_parent(self, name=f"gate[{err.id}]", error=err) for err in errors]
        return out


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection, so they apply to gate items too
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption(OPTION):
        return
    # No test file is needed (a third-party package runs this in its own tree). The node id is explicit:
    # the session's own is empty. genitems sends the usual collect hooks, so counts and reports see the items.
    node = GateCollector.from_parent(session, name="hloforge-gate", nodeid="hloforge-gate")
    items.extend(session.genitems(node))
