"""The project's own promises: the README's commands are the ones CI runs."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_has_exactly_two_setup_commands_one_for_the_app_and_one_for_the_tests():
    setup = readme_commands()[:2]
    assert len(setup) == 2
    assert setup[0].endswith("app.py") and "requirements.txt" in setup[0]
    assert "pytest" in setup[1] and "requirements-dev.txt" in setup[1]


def test_ci_runs_the_readmes_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines
