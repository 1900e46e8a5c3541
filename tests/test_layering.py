"""The package's layers (docs/architecture.md): no import crosses a layer the page forbids.

Every module under functrain/ is parsed with `ast` (nothing is imported): each `import` and
`from ... import` -- absolute or relative, at the top, inside functions or under
`if TYPE_CHECKING:` -- is resolved to the functrain module it names and checked against the
rules below. A failure names the file, the line, the import and the rule it breaks.

A part of the package is a subpackage (`functrain/step/`) or a root module (`functrain/units.py`).
Each part sits in one layer; a part may import the parts of the layers below its own, and the
parts of its own layer only where `SAME_LAYER` says so. The named rules come first, for a clearer
message where the issue (25, point 5) named them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "functrain"

# Top to bottom; keep in step with the table in docs/architecture.md.
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("the process front", frozenset({"launch"})),
    ("the public API and the tools that use it", frozenset({"__init__", "testing", "plot"})),
    ("the loop and its observers", frozenset({"loop", "callbacks", "loggers"})),
    ("the step and its transforms", frozenset({"step", "algorithms", "recipes"})),
    ("the math", frozenset({"optim", "schedules", "functional", "models", "ensemble"})),
    ("placement and storage", frozenset({"parallel", "checkpoint", "state", "export"})),
    ("values", frozenset({"units", "rng", "data", "metrics", "datasets", "streaming"})),
    ("foundations", frozenset({"tree", "_lazy", "_torch"})),
]

# Imports allowed between parts of one layer: (importer, imported).
SAME_LAYER: frozenset[tuple[str, str]] = frozenset({
    ("loop", "loggers"),  # the default progress bar and console
    ("loop", "callbacks"),
    ("callbacks", "loggers"),  # a callback hands its values to the loggers
    ("loggers", "callbacks"),  # the console logger's interval is a callback's
    ("testing", "__init__"),  # the law checkers run `fit` as a user would
    ("algorithms", "step"),  # the step's record types only (rule below)
    ("recipes", "step"),  # the step's record types only (rule below)
    ("recipes", "algorithms"),
    ("functional", "optim"),  # gradient clipping's pure core is the optimizer's clip
    ("optim", "schedules"),  # a learning rate may be a schedule
    ("checkpoint", "parallel"),  # a checkpoint reads and writes each rank's shard
    ("state", "parallel"),  # `init` places the parameters on a mesh
    ("export", "checkpoint"),  # exports a checkpoint's weights
    ("data", "rng"),
})  # fmt: skip

# What the algorithms (and recipes) may take from the step: its records, never its machinery.
# (`forward_run`: the `ForwardRun` an algorithm's `Installer` is handed, and `Installer` itself)
STEP_RECORD_MODULES = frozenset(
    {"functrain.step.pieces", "functrain.step.model_calls", "functrain.step.forward_run"}
)
STEP_RECORD_NAMES = frozenset({"Algorithm", "StepPieces", "GradResult", "StepConfig"})

# Violations present today, each with the change that removes it. The test fails when one is no
# longer found (remove it here), so this set only shrinks. Entries: (file, imported module).
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository root, e.g. "functrain/step/make.py"
    line: int
    module: str  # the functrain module imported, e.g. "functrain.loop.api"
    names: tuple[str, ...]  # for `from module import a, b`; () for a module
    source: str  # the statement as written

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: `{self.source}`"


def part_of(module: str, package: Path) -> str:
    """The part a dotted functrain module belongs to ("functrain.step.make" -> "step").

    `functrain` itself, or a name `from functrain import` takes that is no module of its own,
    is the public API ("__init__").
    """
    pieces = module.split(".")
    if len(pieces) == 1:
        return "__init__"
    name = pieces[1]
    if (package / name).is_dir() or (package / f"{name}.py").is_file():
        return name
    return "__init__"


def imports_of(path: Path, package: Path) -> list[Import]:
    """Every import of a functrain module in one source file, wherever it is in the file."""
    rel = path.relative_to(package.parent).as_posix()
    dotted = path.relative_to(package.parent).with_suffix("").parts
    home = list(dotted[:-1])  # the package the file is in (for a relative import)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package.name:
                    found.append(Import(rel, node.lineno, alias.name, (), ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = home[: len(home) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != package.name:
                continue
            names = tuple(a.name for a in node.names)
            # `from functrain import step` or `from . import status` imports a submodule: name it.
            subs = [n for n in names if _is_module(f"{module}.{n}", package)]
            if subs:
                found += [
                    Import(rel, node.lineno, f"{module}.{n}", (), ast.unparse(node)) for n in subs
                ]
            rest = tuple(n for n in names if n not in subs)
            if rest:
                found.append(Import(rel, node.lineno, module, rest, ast.unparse(node)))
    return found


def _is_module(module: str, package: Path) -> bool:
    path = package.parent.joinpath(*module.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _layer(part: str) -> int | None:
    return next((i for i, (_, parts) in enumerate(LAYERS) if part in parts), None)


def broken_rule(imp: Import, package: Path) -> str | None:
    """Why `imp` crosses a layer, or None when it may."""
    src = part_of(".".join(Path(imp.file).with_suffix("").parts), package)
    if Path(imp.file).name == "__init__.py" and Path(imp.file).parent == package:
        src = "__init__"
    dst = part_of(imp.module, package)
    if src == dst:
        return None
    if dst == "launch":
        return (
            "nothing in the package imports the launcher (functrain/launch/ is the process front)"
        )
    if src == "step" and dst in {"loop", "callbacks", "loggers"}:
        return "the step never imports the loop, its callbacks or its loggers"
    if src == "checkpoint" and dst in {"loop", "callbacks", "loggers", "step", "algorithms"}:
        return "the checkpoint package imports neither the loop nor the step"
    if src in {"callbacks", "loggers"} and dst == "loop":
        return "callbacks and loggers observe the loop through the Context they are handed"
    if src in {"algorithms", "recipes"} and dst == "step":
        records = imp.module in STEP_RECORD_MODULES or (
            imp.module == "functrain.step" and set(imp.names) <= STEP_RECORD_NAMES
        )
        if not records:
            return (
                "algorithms import the step's record types only (functrain.step.pieces, "
                f"functrain.step.model_calls, functrain.step.forward_run, or "
                f"{sorted(STEP_RECORD_NAMES)} from functrain.step)"
            )
        return None
    if dst == "__init__" and (src, dst) not in SAME_LAYER:
        return "no module imports the public API (`functrain` itself): import the module you need"
    src_layer, dst_layer = _layer(src), _layer(dst)
    for part, layer in ((src, src_layer), (dst, dst_layer)):
        if layer is None:
            return (
                f"functrain/{part} is in no layer: add it to LAYERS in tests/test_layering.py and to "
                "the table in docs/architecture.md"
            )
    assert src_layer is not None and dst_layer is not None
    if dst_layer > src_layer or (dst_layer == src_layer and (src, dst) in SAME_LAYER):
        return None
    where = "its own layer" if dst_layer == src_layer else "a higher layer"
    return (
        f"'{src}' ({LAYERS[src_layer][0]}) may not import '{dst}' ({where}: {LAYERS[dst_layer][0]})"
    )


def violations(package: Path = PACKAGE) -> list[tuple[Import, str]]:
    """Every import under `package` that breaks a rule, with the rule."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for imp in imports_of(path, package):
            rule = broken_rule(imp, package)
            if rule is not None:
                found.append((imp, rule))
    return found


def test_no_import_crosses_a_layer():
    found = violations()
    new = [f"{imp}\n    breaks: {rule}" for imp, rule in found
           if (imp.file, imp.module) not in KNOWN_VIOLATIONS]  # fmt: skip
    assert not new, (
        "imports that cross a layer (see docs/architecture.md; move the code to the layer it "
        "belongs to, or pass the value in from above):\n" + "\n".join(new)
    )


def test_every_known_violation_is_still_needed():
    present = {(imp.file, imp.module) for imp, _ in violations()}
    fixed = sorted(KNOWN_VIOLATIONS - present)
    assert not fixed, f"no longer violated, remove from KNOWN_VIOLATIONS: {fixed}"


def test_every_part_of_the_package_is_in_a_layer():
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    placed = set().union(*(parts_ for _, parts_ in LAYERS))
    assert sorted(parts - placed) == [], "add these to LAYERS and to docs/architecture.md"


def test_the_page_names_every_layer():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for name, parts in LAYERS:
        assert name in page, name
        for part in parts:
            assert f"`{part}`" in page, f"docs/architecture.md does not place `{part}`"


# The checker itself, on a small package written for the test.


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "functrain"
    for name in ("step", "loop", "algorithms", "checkpoint", "launch", "callbacks"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "__init__.py").write_text("")
    for name in ("units", "state", "parallel"):
        (root / f"{name}.py").write_text("")
    (root / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("rel", "source", "rule"),
    [
        ("step/make.py", "from ..loop import api\n", "the step never imports the loop"),
        ("step/make.py", "def f():\n    import functrain.loop.run\n", "never imports the loop"),
        ("step/make.py", "from functrain.callbacks import x\n", "never imports the loop"),
        ("checkpoint/manager.py", "from ..launch import status\n", "nothing in the package"),
        ("checkpoint/manager.py", "from functrain.loop import fit\n", "imports neither the loop"),
        ("algorithms/ema.py", "from ..step.make import make_step\n", "record types only"),
        ("algorithms/ema.py", "from ..step import Algorithm, compose\n", "record types only"),
        ("units.py", "from .state import TrainState\n", "may not import 'state'"),
        ("state.py", "import functrain\n", "no module imports the public API"),
        ("callbacks/x.py", "if True:\n    from ..loop.run import FitRun\n", "observe the loop"),
    ],
)
def test_a_forbidden_import_is_caught(tmp_path, rel, source, rule):
    package = _package(tmp_path, {rel: source})
    found = violations(package)
    assert len(found) == 1, found
    imp, broken = found[0]
    assert imp.file == f"functrain/{rel}"
    assert rule in broken, broken


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("algorithms/ema.py", "from ..step import Algorithm, StepPieces\n"),
        ("algorithms/ema.py", "from ..step.pieces import GradResult\n"),
        ("algorithms/ema.py", "from functrain.step.model_calls import ModelCalls\n"),
        ("step/make.py", "from ..state import TrainState\nfrom . import pieces\n"),
        ("loop/run.py", "from ..step import make_step\nfrom ..units import Time\n"),
        ("state.py", "from .parallel import x\n"),
    ],
)
def test_an_allowed_import_passes(tmp_path, rel, source):
    package = _package(tmp_path, {rel: source})
    assert violations(package) == []


MAX_MODULE_LINES = 400  # issue 25: every module one concept, at most this long


def test_every_module_is_at_most_400_lines():
    """No module under functrain/ is over `MAX_MODULE_LINES` (split it along its concepts)."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_the_package_root_holds_at_most_14_modules():
    """The root keeps only what is cross-cutting (issue 25); the rest lives in subpackages."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 14, modules
