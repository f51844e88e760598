"""The package's shape, checked from its source with `ast` (imports inside functions count): no import cycle, no
import from a lower layer to a higher one, no function over 60 lines, few top-level modules, and no package that
only one step of a run uses imported at the start of every process. docs/architecture.md describes the layers."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_sentcl"

#: lowest first; a module may import its own layer and the ones before it
LAYERS = (
    ("common",),
    ("configs",),
    ("hub",),
    ("registry",),
    ("losses", "augment"),
    ("modeling",),
    ("evaluation",),
    ("data",),
    ("trainers",),
    ("methods",),
    ("recipe",),
    ("export",),
    ("pipeline",),
    ("cli",),
    ("run", "__main__", "__init__"),
)
MAX_FUNCTION_LINES = 60
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "registry.py", "run.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def package_of(name: str, path: Path) -> list[str]:
    """The package a module's relative imports start from."""
    return name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]


def import_targets(node: ast.AST, package: list[str]) -> list[str]:
    """The module names an import statement names (`from pkg import name` names pkg and pkg.name); [] for any other
    node."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level else node.module
        return [f"{base}.{alias.name}" for alias in node.names] + [base]
    return []


def known_module(target: str, known: dict[str, Path]) -> str | None:
    """The package's module that importing `target` runs (`pkg.mod.CONSTANT` -> pkg.mod), or None outside it."""
    while target and target not in known and "." in target:
        target = target.rsplit(".", 1)[0]
    return target if target in known else None


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (`from pkg import submodule` included)."""
    package = package_of(name, path)
    targets = (known_module(t, known) for node in ast.walk(ast.parse(path.read_text()))
               for t in import_targets(node, package))
    return {target for target in targets if target is not None and target != name}


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def layer_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    for index, names in enumerate(LAYERS):
        if part in names:
            return index
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py's LAYERS (docs/architecture.md)")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_cycle_detection_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_imports_point_down_the_layers():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in import_graph().items()
        for target in targets
        if layer_of(target) > layer_of(module) and not (module == "hf_sentcl" and target.startswith("hf_sentcl."))
    ]
    assert upward == []


def long_functions() -> list[str]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.slow
def test_no_function_over_60_lines():
    assert long_functions() == []


def test_top_level_modules():
    assert {p.name for p in PACKAGE.glob("*.py")} <= TOP_LEVEL_MODULES


@pytest.mark.parametrize("command", ["train", "evaluate", "export", "push", "sweep", "glue", "analyze", "data", "mine"])
def test_every_command_has_a_module_with_main(command):
    import importlib

    from hf_sentcl.cli import COMMANDS

    assert callable(importlib.import_module(COMMANDS[command][0]).main)


# ------------------------------------------------------------------------------------------------ start-up imports
#: packages a run needs only in the step that uses them (plots, probes, MTEB files, the export's check): imported
#: there, not by `import hf_sentcl.run`, whose start every process of every launch pays (about 1.8 s of 12 for
#: matplotlib and scikit-learn on a 2-core AVX2 EPYC)
DEFERRED_PACKAGES = ("matplotlib", "sklearn", "mteb", "sentence_transformers")


def module_level_imports(path: Path, package: list[str]) -> set[str]:
    """The modules `path` imports when it is imported: its top-level statements, `if`/`try` blocks included, less
    `if TYPE_CHECKING:` blocks and function bodies."""
    found: set[str] = set()
    pending = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        found.update(import_targets(node, package))
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]
    return found


def imported_at_start(entry: str) -> set[str]:
    """Every module name (the package's and others') that importing `entry` imports, by module-level statements
    followed through the package's modules and their parent packages."""
    known = modules()
    seen, names, pending = set(), set(), [entry]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        pending += [".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in known]
        targets = module_level_imports(known[name], package_of(name, known[name]))
        names |= targets
        pending += [module for module in (known_module(t, known) for t in targets) if module is not None]
    return names


def test_a_process_start_does_not_import_what_one_step_uses():
    imported = imported_at_start("hf_sentcl.run")
    assert "hf_sentcl.evaluation.plots" in imported and "torch" in imported  # the walk follows the package
    early = sorted(name for name in imported if name.split(".")[0] in DEFERRED_PACKAGES)
    assert early == []


def test_the_command_lines_help_and_data_commands_start_without_torch():
    """`hf-sentcl --help` and `hf-sentcl data` load neither torch nor transformers (10 s of a process start on a
    2-core CPU): the package's `SentenceEncoder` is imported on first use."""
    import subprocess
    import sys

    check = ("import sys; from hf_sentcl.cli import main; import hf_sentcl.cli.data; main(['--help']); "
             "sys.exit(sorted({'torch', 'transformers'} & set(sys.modules)) or None)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0 and "commands:" in done.stdout, done.stderr
    from hf_sentcl import SentenceEncoder, SentenceEncoderConfig, modeling

    assert (SentenceEncoder, SentenceEncoderConfig) == (modeling.SentenceEncoder, modeling.SentenceEncoderConfig)
