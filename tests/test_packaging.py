"""The package as a user installs it: a wheel built from the repository carries what the `vitviz` command needs
(the bundled checkpoints, the colormaps) and runs offline from any folder, drawing what `python -m vitviz`
draws in the repository; and its metadata names the packages requirements.txt pins, with bounds those pins meet."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import vitviz
from vitviz import catalog
from vitviz.export import MANIFEST

ROOT = Path(__file__).resolve().parents[1]
BUILT_FROM = ("pyproject.toml", "vitviz", "checkpoints")   # what setuptools reads to build the wheel
PHOTO = ROOT / "assets" / "horse.jpg"
EXPLAIN = ["explain", "photo.jpg", "--models", "vit-cifar10", "cvt-cifar10", "--out", "out"]
# imported only inside the functions that read a video or load a CLIP model: extras, not dependencies
EXTRAS = {"av": "video", "open-clip-torch": "clip", "ftfy": "clip", "regex": "clip"}


def pinned(requirements: Path) -> list[Requirement]:
    """The package lines of a requirements file (not its comments, -r and -e lines)."""
    lines = (line.split(" #")[0].strip() for line in requirements.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith(("#", "-"))]


def site_packages(python: Path) -> Path:
    """The site-packages folder of the environment `python` runs in."""
    return Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=120).stdout.strip())


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"} | extra


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds, offline, from a copy of the repository's sources (setuptools writes build/ and
    vitviz.egg-info beside what it builds)."""
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "train_state.pt"))
        else:
            shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--wheel-dir", str(dist), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = dist.glob("vitviz-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed --no-deps: it sees the test environment's packages
    (a .pth file naming its site-packages, whose own .pth files, the editable vitviz's among them, it does not run),
    and vitviz only from the wheel."""
    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    (site_packages(python) / "test-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return folder


def explain_in(folder: Path, command: list[str], **env: str) -> Path:
    """`command` run in a new `folder` holding the photo as photo.jpg; the folder it wrote."""
    folder.mkdir()
    shutil.copy(PHOTO, folder / "photo.jpg")
    done = subprocess.run([*command, *EXPLAIN], cwd=folder, env=offline_env(**env), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return folder / "out"


def files_in(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_wheel_runs_offline_from_another_folder_and_draws_what_the_repository_draws(venv, tmp_path):
    installed = files_in(explain_in(tmp_path / "installed", [str(venv / "bin" / "vitviz")]))
    repository = files_in(explain_in(tmp_path / "repository", [sys.executable, "-m", "vitviz"], PYTHONPATH=str(ROOT)))

    assert installed.keys() == repository.keys()
    assert {"photo/vit-cifar10/rollout.npy", "photo/cvt-cifar10/rollout.npy", "photo/vit-cifar10/rollout.png"} \
        <= installed.keys()
    for name in installed.keys() - {MANIFEST}:   # the arrays, the predictions and every PNG, byte for byte
        assert installed[name] == repository[name], name
    manifests = [json.loads(files[MANIFEST]) for files in (installed, repository)]
    checkpoints = [site_packages(venv / "bin" / "python") / "vitviz" / "checkpoints", ROOT / "checkpoints"]
    for manifest, folder in zip(manifests, checkpoints):
        del manifest["created"]
        for model in manifest["models"]:   # each side read the bundled weights it carries
            assert Path(model["source"].pop("location")) == folder / model["name"]
    assert manifests[0] == manifests[1]


@pytest.mark.slow
def test_the_vitviz_command_shows_its_help_and_exits_with_mains_status(venv, tmp_path):
    vitviz_command = str(venv / "bin" / "vitviz")
    shown = subprocess.run([vitviz_command, "--help"], cwd=tmp_path, env=offline_env(), capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert all(command in shown.stdout for command in ("explain", "evaluate", "compare", "video", "models"))
    refused = subprocess.run([vitviz_command, "explain", "missing.jpg", "--out", "out"], cwd=tmp_path,
                             env=offline_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "missing.jpg does not exist" in refused.stderr


@pytest.mark.slow
def test_the_wheel_holds_every_module_the_bundled_models_and_vitviz_version(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"vitviz-{vitviz.__version__}.dist-info/METADATA").decode()
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "vitviz").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert {"vitviz/render/colormaps.npz", "vitviz/concepts/analysis/words.txt", "vitviz/looks/natural.safetensors",
            "vitviz/atlas/static/atlas.css", "vitviz/atlas/static/atlas.js"} <= names
    for dictionary in catalog.BUNDLED_DICTIONARIES.values():   # the depth dictionaries sit a folder deeper
        shipped = {str(p.relative_to(ROOT / "checkpoints")) for p in dictionary.path.iterdir()
                   if p.suffix in (".safetensors", ".json")}
        assert {f"vitviz/checkpoints/{name}" for name in shipped} <= names, dictionary.name
    circuits = {f"vitviz/checkpoints/circuits/{p.name}" for p in catalog.CLASS_CIRCUITS.glob("*.json")}
    assert len(circuits) == 20 and circuits <= names   # the bundled pair's class circuits, every class
    for entry in catalog.bundled():
        assert {f"vitviz/checkpoints/{entry.source}/config.json",
                f"vitviz/checkpoints/{entry.source}/model.safetensors"} <= names, entry.name
        kept = {str(p.relative_to(ROOT / "checkpoints")) for p in (entry.path / "steps").rglob("*")
                if p.name in ("config.json", "model.safetensors") or p.suffix == ".json"}
        assert {f"vitviz/checkpoints/{name}" for name in kept} <= names, entry.name   # its training run
    assert f"\nVersion: {vitviz.__version__}\n" in metadata


def test_the_package_requires_requirements_txts_packages_at_bounds_its_pins_meet():
    declared = {}
    for line in requires("vitviz"):
        requirement = Requirement(line)
        extra = str(requirement.marker).split('extra == "')[1].rstrip('"') if requirement.marker else None
        declared[canonicalize_name(requirement.name), extra] = requirement
    for pin in pinned(ROOT / "requirements.txt"):
        name = canonicalize_name(pin.name)
        extra = EXTRAS.get(name)
        assert (name, extra) in declared, f"{pin} is in requirements.txt but not in pyproject.toml ({extra or 'base'})"
        [version] = [spec.version for spec in pin.specifier]
        assert declared[name, extra].specifier.contains(version), f"requirements.txt's {pin} vs {declared[name, extra]}"
    assert {"torch", "timm", "gradio"} <= {name for name, extra in declared if extra is None}


def test_the_test_extra_names_what_requirements_dev_txt_pins():
    """requirements-dev.txt pins what the tests ran; `pip install vitviz[test]` asks for the same packages."""
    declared = {canonicalize_name(Requirement(line).name): Requirement(line) for line in requires("vitviz")
                if 'extra == "test"' in line or 'extra == "docs"' in line}
    for pin in pinned(ROOT / "requirements-dev.txt"):
        name = canonicalize_name(pin.name)
        assert name in declared, f"{pin} is in requirements-dev.txt but not in the test or docs extra"
        [version] = [spec.version for spec in pin.specifier]
        assert declared[name].specifier.contains(version), f"requirements-dev.txt's {pin} vs {declared[name]}"
