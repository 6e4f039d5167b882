"""The documentation site: `mkdocs build --strict` passes (no broken link, no missing reference target), its API
reference renders every module it names, and every public function and class of those modules has a docstring,
so nothing a user can call is missing from the reference."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"


def documented_modules() -> list[str]:
    """The modules the API reference renders: its pages' `::: vitviz...` lines."""
    return sorted({name for page in REFERENCE.glob("*.md")
                   for name in re.findall(r"^::: (vitviz[\w.]*)$", page.read_text(), flags=re.M)})


def source_of(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def undocumented(module: str) -> list[str]:
    """Public functions and classes defined in `module` (those in its `__all__`, where it has one) that have no
    docstring. Read from the source, as the reference is: a dataclass's generated `__doc__` does not count."""
    tree = ast.parse(source_of(module).read_text())
    exported = next((set(ast.literal_eval(node.value)) for node in tree.body if isinstance(node, ast.Assign)
                     and any(getattr(target, "id", None) == "__all__" for target in node.targets)), None)
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not node.name.startswith("_") and (exported is None or node.name in exported)
            and not ast.get_docstring(node)]


def test_the_reference_documents_the_public_modules():
    modules = documented_modules()
    for wanted in ("vitviz", "vitviz.hub", "vitviz.catalog", "vitviz.session", "vitviz.explain.rollout",
                   "vitviz.render.overlay", "vitviz.compare", "vitviz.evaluate", "vitviz.video", "vitviz.export",
                   "vitviz.models.vit", "vitviz.models.trace", "vitviz.image", "vitviz.preprocess", "vitviz.data"):
        assert wanted in modules
    assert all(source_of(module).is_file() for module in modules)


@pytest.mark.parametrize("module", documented_modules())
def test_every_public_function_and_class_of_a_documented_module_has_a_docstring(module):
    assert undocumented(module) == []


@pytest.mark.slow
def test_the_site_builds_strict_and_its_reference_renders_every_documented_module(tmp_path):
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-5000:]
    rendered = " ".join(page.read_text() for page in (site / "reference").rglob("*.html"))
    assert [module for module in documented_modules() if f'id="{module}"' not in rendered] == []
