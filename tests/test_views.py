"""The views are functions of a run in `vitviz/views.py`, and every one the tabs and the exporter draw is
the picture `ModelRun`'s methods drew before the move: tests/fixtures/views_before_move.json, recorded
from them by tests/make_view_fingerprints.py on the four bundled models."""
import inspect
import json

import numpy as np
import pytest

from tests.make_view_fingerprints import FIXTURE, bundled_runs, decoded, drawn_views, fingerprint, machine, sha256
from vitviz import views
from vitviz.session import ModelRun

RECORDED = json.loads(FIXTURE.read_text())
TOLERANCE = 1.0   # grey levels, on the 24x24 area averages: far above another CPU's float rounding


@pytest.fixture(scope="module")
def drawn(one_torch_thread) -> dict:
    return {run.name: drawn_views(run) for run in bundled_runs()}


def test_every_view_the_app_and_the_exporter_draw_is_the_picture_it_was_before_the_move(drawn):
    assert drawn.keys() == RECORDED["views"].keys()
    moved = []
    for model, recorded in RECORDED["views"].items():
        assert drawn[model].keys() == recorded.keys(), model
        for name, entry in recorded.items():
            image, caption = drawn[model][name]
            if caption != entry.get("caption"):
                moved.append(f"{model} {name}: caption {caption!r}, was {entry.get('caption')!r}")
            if image is None or "shape" not in entry:
                assert image is None and "shape" not in entry, (model, name)
            elif list(image.shape) != entry["shape"]:
                moved.append(f"{model} {name}: shape {list(image.shape)}, was {entry['shape']}")
            elif (off := np.abs(fingerprint(image) - decoded(entry["fingerprint"])).max()) > TOLERANCE:
                moved.append(f"{model} {name}: {off:.1f} grey levels off")
    assert not moved, "\n".join(moved)


@pytest.mark.skipif(machine() != RECORDED["machine"], reason="bytes are equal only on the CPU and libraries "
                                                             "that recorded them")
def test_on_the_machine_that_recorded_them_the_views_are_equal_to_the_byte(drawn):
    changed = [f"{model} {name}" for model, recorded in RECORDED["views"].items() for name, entry in recorded.items()
               if "sha256" in entry and sha256(drawn[model][name][0]) != entry["sha256"]]
    assert not changed, "\n".join(changed)


def test_every_view_is_a_function_of_a_run_that_the_fingerprints_draw():
    public = {name for name, f in inspect.getmembers(views, inspect.isfunction)
              if f.__module__ == views.__name__ and not name.startswith("_")}
    fingerprinted = {name.split("(")[0] for name in next(iter(RECORDED["views"].values()))}
    assert public == fingerprinted
    for name in public:
        first = next(iter(inspect.signature(getattr(views, name)).parameters.values()))
        assert first.name == "run" and first.annotation in (ModelRun, "ModelRun"), name
        assert getattr(views, name).__doc__, name
        assert not hasattr(ModelRun, name), f"ModelRun still draws {name}"
