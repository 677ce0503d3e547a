"""The layering, read from the source: no import cycle inside orchestrator/ (imports inside
functions included), and the lower packages never import the upper ones."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as absolute dotted names."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return found


def graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. Importing ``a.b.c`` runs ``a/__init__`` and
    ``a/b/__init__`` too, so those count as imported."""
    known = modules(package)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for target in imports(name, path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            while target in known:
                targets.add(target)
                target = target.rpartition(".")[0]
        edges[name] = targets - {name} - {n for n in targets if name.startswith(n + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_scan_sees_a_cycle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_orchestrator_has_no_import_cycle():
    edges = graph("orchestrator")
    assert len(edges) > 50 and edges["orchestrator.cli.run"]  # the scan read the package
    assert cycles(edges) == []


def test_lower_packages_do_not_import_upper_ones():
    # rolecast/ is the public face (``import rolecast``): above everything, imported by nothing here
    for package, banned in (("sandboxes", ("orchestrator", "plugins", "rolecast")), ("orchestrator", ("plugins", "rolecast")),
                            ("plugins", ("rolecast",))):
        for name, path in modules(package).items():
            bad = sorted(t for t in imports(name, path) if t.split(".")[0] in banned)
            assert not bad, f"{name} imports {bad}"


def test_commands_without_a_model_import_no_heavy_library():
    """Listing plugins or loading a team needs neither a model nor arrays: numpy (via the PettingZoo
    adapter every command registers) cost each command ~0.2 s, xgrammar (with torch and
    transformers, at load) ~4 s."""
    import subprocess
    import sys

    code = ("import sys; from orchestrator.cli import main; from orchestrator.team import load_team; main(['plugins']); "
            f"load_team({str(ROOT / 'recipes/debate.yaml')!r}); "
            "print(*sorted({'numpy', 'torch', 'transformers', 'xgrammar'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "", out.stdout.splitlines()[-1]


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_docs_architecture_names_every_module():
    """docs/architecture.md is the module map: a module added to the top level or to a package
    whose files it lists, and not named there, fails here."""
    named = set(re.findall(r"`(\w+)(?:\.py)?`", ARCHITECTURE))
    files = set(re.findall(r"`(\w+\.py)`", ARCHITECTURE))
    top = {path.stem for path in (ROOT / "orchestrator").glob("*.py")} - {"__init__"}
    assert not top - named, f"orchestrator/ modules not in docs/architecture.md: {sorted(top - named)}"
    for package in ("sandboxes", "orchestrator/grammar", "orchestrator/engines", "orchestrator/policies",
                    "orchestrator/issue_fix", "orchestrator/training"):
        listed = {path.name for path in (ROOT / package).glob("*.py")} - {"__init__.py"}
        assert not listed - files, f"{package} modules not in docs/architecture.md: {sorted(listed - files)}"


def test_the_lower_packages_import_what_docs_architecture_says():
    """The doc's foundations, as it lists them, import none of orchestrator's packages; grammar/
    imports engines/tokens only, engines/ the foundations and grammar/, envs/ the foundations and role."""
    sentence = re.search(r"Foundations that import none of orchestrator's packages:(.*?)Above them", ARCHITECTURE, re.S)
    listed = re.sub(r"\([^()]*\)", "", sentence.group(1))  # the names, without what each does
    foundations = {f"orchestrator.{name}" for name in re.findall(r"`(\w+)`", listed)}
    edges = graph("orchestrator")
    assert len(foundations) >= 10 and foundations <= set(edges), foundations

    def within(name: str) -> set[str]:
        return {n for n in edges if n == name or n.startswith(name + ".")}

    allowed = {name: foundations for name in foundations}
    allowed |= {name: within("orchestrator.grammar") | {"orchestrator.engines", "orchestrator.engines.tokens"}
                for name in within("orchestrator.grammar")}
    allowed |= {name: foundations | within("orchestrator.engines") | within("orchestrator.grammar")
                for name in within("orchestrator.engines")}
    allowed |= {name: foundations | within("orchestrator.envs") | {"orchestrator.role"} for name in within("orchestrator.envs")}
    for name, ok in allowed.items():
        assert edges[name] <= ok, f"{name} imports {sorted(edges[name] - ok)}"
