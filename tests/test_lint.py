"""The code passes the linter pyproject.toml configures (ruff: pyflakes, pycodestyle errors, import order,
bugbear): no unused import or name, imports in order, none of bugbear's likely bugs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing_in_the_repository():
    checked = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
