"""The package's import graph: no cycles, and a pure core.

Every import inside ``shared/drcredit`` counts, wherever it stands (module level,
function body, ``TYPE_CHECKING`` block): a function-level import is still a dependency,
and a cycle hidden inside a function is still a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "shared" / "drcredit"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rsplit(".", 1)[0] if "." in target else ""
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def external_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_no_import_cycles() -> None:
    edges = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_domain_imports_only_the_standard_library_pydantic_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"pydantic", "pydantic_core", "drcredit", "__future__"}
    for path in (PACKAGE / "domain").rglob("*.py"):
        foreign = external_imports(path) - allowed
        assert not foreign, f"{path.name} imports {sorted(foreign)}"
        inner = {t for t in graph()[module_name(path)] if not t.startswith("drcredit.domain")}
        assert not inner, f"{path.name} imports {sorted(inner)} outside the domain"


#: The packages' layers (docs/architecture.md, "Who may import what"): a package imports
#: only packages of a lower layer. ``wiring`` is the composition root: it builds a process
#: from ``scoring``, ``broker`` and ``audit``, so none of them (nor anything else in the
#: library) may import it, and ``scoring`` may not import the packages built on it.
#: Top-level modules (settings, metrics, logs, process) and packages not listed are free.
LAYERS = {
    "domain": 0,
    "judges": 1,
    "storage": 1,
    "scoring": 2,
    "analytics": 3,
    "audit": 3,
    "broker": 3,
    "wiring": 4,
}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    out: list[str] = []
    for name, targets in sorted(edges.items()):
        source = package_of(name)
        for target in sorted(targets):
            dest = package_of(target)
            if source in LAYERS and dest in LAYERS and source != dest and LAYERS[dest] >= LAYERS[source]:
                out.append(f"{name} -> {target}")
    return out


def test_no_package_imports_one_of_its_own_layer_or_above() -> None:
    violations = layer_violations(graph())
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def test_the_layer_check_refuses_scoring_importing_broker_or_audit() -> None:
    """The checker itself: the two arrows that once ran back up are refused."""
    assert layer_violations(
        {
            "drcredit.scoring.engine": {"drcredit.broker.app", "drcredit.audit.judges", "drcredit.storage.database"},
            "drcredit.wiring.runtime": {"drcredit.broker.app"},
            "drcredit.broker.dispatch": {"drcredit.wiring.runtime"},
        }
    ) == [
        "drcredit.broker.dispatch -> drcredit.wiring.runtime",
        "drcredit.scoring.engine -> drcredit.audit.judges",
        "drcredit.scoring.engine -> drcredit.broker.app",
    ]


def test_the_cycle_check_sees_a_function_level_import(tmp_path: Path) -> None:
    """The checker itself: an import inside a function is an edge like any other."""
    source = "def f():\n    from drcredit.scoring.pipeline import Pipeline\n"
    names = [n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]
    assert names == ["drcredit.scoring.pipeline"]
    assert "drcredit.scoring.work.units" in graph()["drcredit.scoring.work.outcome_unit"]
