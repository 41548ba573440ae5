"""The tree shows the pipeline: each stage imports only the stages below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "fr2perfetto"
# bottom to top; what is not in a sub-package (cli, api, convert, capture, trigger, serve) is the top
LAYERS = ["base", "proto", "read", "match", "diagnose", "layout", "render"]
TOP = len(LAYERS)


def _layer(module: str) -> int:
    """The layer of a module, by its dotted name under fr2perfetto (``read.job``)."""
    head = module.split(".")[0]
    if head in ("base", "proto", "_speedups"):
        return 0
    return LAYERS.index(head) if head in LAYERS else TOP


def _imports(path: Path) -> list[str]:
    """The fr2perfetto modules a file imports (dotted under fr2perfetto), relative imports resolved."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level])
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.startswith("fr2perfetto"):
                target = node.module.split(".")[1:]
            else:
                continue
            if target:
                found.append(".".join(target))
            else:  # from . import x: each name a module of the package
                found += [alias.name for alias in node.names if alias.name != "__version__"]
        elif isinstance(node, ast.Import):
            found += [a.name.split(".", 1)[1] for a in node.names if a.name.startswith("fr2perfetto.")]
    return found


def test_each_stage_imports_only_the_stages_below_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "proto" in path.parts:
            continue
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own = _layer(module) if "." in module or module in LAYERS else TOP
        for target in _imports(path):
            if _layer(target) > own:
                wrong.append(f"{module} (layer {own}) imports {target} (layer {_layer(target)})")
    assert not wrong, "\n".join(wrong)


def test_the_stages_are_sub_packages_and_nothing_else_lies_beside_them():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "api", "capture", "cli", "convert", "serve", "trigger"]
    assert all((PACKAGE / layer / "__init__.py").exists() for layer in LAYERS)
