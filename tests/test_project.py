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


def test_space_front_matter_lists_the_catalogs_hub_repos():
    from vitviz import catalog
    front = (ROOT / "README.md").read_text().split("---")[1]
    listed = re.findall(r"^  - (\S+)$", front, flags=re.M)
    assert listed == [e.source for e in catalog.CATALOG.values() if not e.bundled]
    assert 'python_version: "3.11"' in front and "app_file: app.py" in front and "sdk: gradio" in front
