"""The command line and the Python API for batch work, on the bundled models (no network)."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitviz
from vitviz import cli, export
from vitviz.export import MANIFEST
from vitviz.files import safe_name
from vitviz.image import read_image
from vitviz.session import decode_side, explain_image

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["vit-cifar10", "cvt-cifar10"]
METHODS = ["rollout", "grad-rollout", "chefer"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Three generated photos-to-be (different sizes and aspects) and one corrupt file."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name, (h, w) in {"wide": (120, 200), "tall": (300, 160), "square": (64, 64)}.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{name}.png")
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    return folder


@pytest.fixture(scope="module")
def run_dir(images, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out")
    code = cli.main(["explain", str(images), "--models", *MODELS, "--methods", *METHODS, "--out", str(out),
                     "--batch-size", "2", "--faithfulness-steps", "4"])
    assert code == 0
    return out


def test_explain_writes_every_file_its_manifest_lists_and_skips_the_corrupt_image(run_dir):
    manifest = json.loads((run_dir / MANIFEST).read_text())
    assert [m["name"] for m in manifest["models"]] == MODELS
    assert all(m["source"]["layout"] == "vitviz" for m in manifest["models"])
    assert sorted(e["id"] for e in manifest["images"]) == ["square", "tall", "wide"]
    assert [Path(s["path"]).name for s in manifest["skipped"]] == ["corrupt.jpg"]
    assert "not" in manifest["skipped"][0]["reason"].lower()
    for entry in manifest["images"]:
        for model in entry["models"]:
            assert set(model["maps"]) == set(METHODS)
            assert set(model["faithfulness"]) == set(METHODS)
            folder = run_dir / entry["id"] / safe_name(model["model"])
            expected = {"predictions.json", *(f"{m}.{ext}" for m in METHODS for ext in ("npy", "png")),
                        "grid-1.png", "stage-1-pca.png"}
            assert expected <= set(model["files"])
            for name in model["files"]:
                assert (folder / name).stat().st_size > 0
    assert not list(run_dir.rglob("*.tmp"))


def test_exported_maps_equal_what_the_python_api_returns(run_dir, images):
    models = [vitviz.load(name) for name in MODELS]
    image = read_image(images / "tall.png", target_size=decode_side(models))
    for run in explain_image(image, models):
        folder = run_dir / "tall" / safe_name(run.name)
        for method in METHODS:
            np.testing.assert_allclose(np.load(folder / f"{method}.npy"), run.token_map(method), atol=1e-6)
        top = json.loads((folder / "predictions.json").read_text())["top5"]
        assert [p["index"] for p in top] == [p.index for p in run.top(5)]


def test_resume_skips_complete_images_and_does_no_work(run_dir, images, monkeypatch, capsys):
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*.npy")}
    monkeypatch.setattr(export, "explain_images", lambda *a, **k: pytest.fail("--resume ran a model"))
    code = cli.main(["explain", str(images), "--models", *MODELS, "--methods", *METHODS, "--out", str(run_dir),
                     "--resume", "--faithfulness-steps", "4"])
    assert code == 0
    assert "3 image(s) already complete, 1 to do" in capsys.readouterr().err
    assert before == {p: p.stat().st_mtime_ns for p in run_dir.rglob("*.npy")}
    assert len(json.loads((run_dir / MANIFEST).read_text())["images"]) == 3


def test_resume_redoes_an_image_whose_files_are_incomplete(run_dir, images, capsys):
    (run_dir / "wide" / "cvt-cifar10" / "chefer.npy").unlink()
    assert cli.main(["explain", str(images), "--models", *MODELS, "--methods", *METHODS, "--out", str(run_dir),
                     "--resume", "--faithfulness-steps", "4"]) == 0
    assert "2 image(s) already complete, 2 to do" in capsys.readouterr().err
    assert (run_dir / "wide" / "cvt-cifar10" / "chefer.npy").is_file()


def test_bad_out_and_missing_paths_are_clear_errors(images, tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert cli.main(["explain", str(images), "--out", str(a_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert cli.main(["explain", str(tmp_path / "nope.jpg"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["explain", str(tmp_path / "*.jpeg"), "--out", str(tmp_path / "o")]) == 2
    assert "no file matches" in capsys.readouterr().err


def test_app_zip_and_cli_folder_hold_the_same_files_for_the_same_image(tmp_path):
    from vitviz.ui import download, page
    photo = ROOT / "assets" / "horse.jpg"
    assert cli.main(["explain", str(photo), "--models", *MODELS, "--methods", "rollout", "chefer",
                     "--out", str(tmp_path / "cli"), "--faithfulness-steps", "0"]) == 0
    key = page.explain({"path": str(photo)}, *MODELS, progress=lambda *a, **k: None).key
    with zipfile.ZipFile(download.download(key, ["rollout", "chefer"])) as archive:
        zipped = {Path(n).relative_to("image").as_posix() for n in archive.namelist() if n != MANIFEST}
        zip_manifest = json.loads(archive.read(MANIFEST))
    cli_files = {p.relative_to(tmp_path / "cli" / "horse").as_posix()
                 for p in (tmp_path / "cli" / "horse").rglob("*") if p.is_file()}
    assert zipped == cli_files
    assert set(zip_manifest) == set(json.loads((tmp_path / "cli" / MANIFEST).read_text()))


def test_every_exported_png_is_the_picture_the_app_draws_for_the_same_request(tmp_path):
    """Pixels, not bytes: the map is the first screen's, the stage views the Features tab's; a grid is the Tokens
    tab's picture with the words the page prints beside it written on it (inside one box) and the caption under it."""
    from vitviz.ui import features, page, tokens
    photo = ROOT / "assets" / "horse.jpg"
    assert cli.main(["explain", str(photo), "--models", *MODELS, "--out", str(tmp_path),
                     "--faithfulness-steps", "0"]) == 0
    answer = page.explain({"path": str(photo)}, *MODELS, progress=lambda *a, **k: None)
    grids = tokens.render_tokens(answer.key)
    entry = json.loads((tmp_path / MANIFEST).read_text())["images"][0]
    for model, first_screen, stage_views, grid_pictures in zip(entry["models"], (answer.map_a, answer.map_b),
                                                              features.render_stages(answer.key),
                                                              (grids.grid_a, grids.grid_b)):
        folder = tmp_path / "horse" / safe_name(model["model"])
        drawn = {"rollout.png": first_screen}
        for k in range(len(grid_pictures)):
            drawn[f"stage-{k + 1}-pca.png"] = stage_views[2 * k]
            drawn[f"stage-{k + 1}-norm.png"] = stage_views[2 * k + 1]
        grid_names = {f"grid-{k + 1}.png" for k in range(len(grid_pictures))}
        assert {p.name for p in folder.glob("*.png")} == set(drawn) | grid_names
        for name, view in drawn.items():
            assert np.array_equal(np.asarray(Image.open(folder / name)), view), f"{model['model']} {name}"
        for k, picture in enumerate(grid_pictures):
            exported = np.asarray(Image.open(folder / f"grid-{k + 1}.png"))
            assert exported.shape[1:] == picture.shape[1:] and exported.shape[0] > picture.shape[0]   # + the caption
            rows, cols = np.nonzero((exported[:picture.shape[0]] != picture).any(axis=2))
            if len(rows):   # the words, in one box of at most a fifth of the picture
                box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
                assert box <= picture.shape[0] * picture.shape[1] / 5, f"{model['model']} grid {k + 1}"


def test_models_command_lists_the_catalog_and_marks_the_bundled_models():
    result = subprocess.run([sys.executable, "-m", "vitviz", "models"], capture_output=True, text=True, cwd=ROOT,
                            env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert {"vit-base", "cvt-13", "deit-tiny-distilled"} <= set(lines)
    assert "bundled" in lines["vit-cifar10"] and "bundled" in lines["cvt-cifar10"]


def test_anatomy_writes_attention_distance_averaged_over_images(images, tmp_path):
    assert cli.main(["anatomy", "vit-cifar10", "--images", str(images), "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "vit-cifar10-attention-distance.json").read_text())
    assert data["images"] == 3   # the corrupt file is skipped
    assert len(data["per_layer_per_head"]) == len(vitviz.load("vit-cifar10").model.blocks)
    for name in ("attention-distance", "filters", "position-similarity"):
        assert Image.open(tmp_path / f"vit-cifar10-{name}.png").size[0] > 100


def test_formats_npy_writes_the_arrays_and_no_picture_and_resume_adds_the_pictures(images, tmp_path, capsys):
    args = ["explain", str(images), "--models", *MODELS, "--methods", "rollout", "chefer", "--out", str(tmp_path),
            "--faithfulness-steps", "2"]
    assert cli.main([*args, "--formats", "npy"]) == 0
    assert not list(tmp_path.rglob("*.png"))
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    for model in manifest["images"][0]["models"]:
        assert model["files"] == ["chefer.npy", "predictions.json", "rollout.npy"]
        assert set(model["faithfulness"]) == {"rollout", "chefer"}
    assert cli.main([*args, "--resume"]) == 0   # png asked for now: every image is redone
    assert "resume: 0 image(s) already complete, 4 to do" in capsys.readouterr().err
    assert {p.name for p in (tmp_path / "square" / "vit-cifar10").glob("*.png")} >= {"rollout.png", "chefer.png",
                                                                                    "grid-1.png", "stage-1-pca.png"}


def test_explain_under_two_torchrun_ranks_writes_what_one_process_writes(images, tmp_path):
    """Whole batches are dealt to the ranks; rank 0 merges the manifest. Same threads per process (torchrun
    gives each one thread), so the arrays are the same to the bit."""
    args = ["-m", "vitviz", "explain", str(images), "--models", *MODELS, "--methods", "rollout", "chefer",
            "--batch-size", "1", "--formats", "npy", "--faithfulness-steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for out, launcher in (("one", []), ("two", ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"])):
        done = subprocess.run([sys.executable, *launcher, *args, "--out", str(tmp_path / out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads((tmp_path / out / MANIFEST).read_text()) for out in ("one", "two"))
    assert {k: v for k, v in one.items() if k != "created"} == {k: v for k, v in two.items() if k != "created"}
    assert [Path(s["path"]).name for s in two["skipped"]] == ["corrupt.jpg"]
    arrays = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.npy"))
    assert len(arrays) == 3 * 2 * 2
    assert all((tmp_path / "one" / a).read_bytes() == (tmp_path / "two" / a).read_bytes() for a in arrays)
    assert {p.name for p in (tmp_path / "two").glob("manifest-rank*.json")} == {"manifest-rank0.json",
                                                                               "manifest-rank1.json"}
