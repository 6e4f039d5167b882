"""The views are functions of a run in `vitviz/views.py`, and every one the tabs and the exporter draw is
the picture `ModelRun`'s methods drew before the move: tests/fixtures/views_before_move.json, recorded
from them by tests/make_view_fingerprints.py on the four bundled models.

Another machine draws the same views with other float rounding (its CPU, BLAS and vector code, whatever its
name and library versions), so some pixels differ from the recorded ones by a grey level or a few: a map value
that lands on the other side of a colour map's step, a resampled edge. The recorded views are therefore compared
by their fingerprints (each view area-averaged to 24x24, so a cell averages hundreds of pixels) within TOLERANCE,
1 grey level of 255: rounding moves a cell's average by a small fraction of a level, while a view that draws
something else (a moved map, another colour map or layout, a changed caption) moves its cells by many. What is
compared exactly is compared with views drawn in the same run: drawn again from a fresh trace, on the same
machine, every view is equal to the byte."""
import inspect
import json

import numpy as np
import pytest

from tests.make_view_fingerprints import FIXTURE, bundled_runs, decoded, drawn_views, fingerprint
from vitviz import views
from vitviz.session import ModelRun

RECORDED = json.loads(FIXTURE.read_text())
TOLERANCE = 1.0   # grey levels of 255, on the 24x24 area averages: far above another machine's float rounding


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


def test_drawn_again_from_a_fresh_trace_every_view_is_equal_to_the_byte(drawn):
    again = {run.name: drawn_views(run) for run in bundled_runs()}
    assert again.keys() == drawn.keys()
    changed = []
    for model, first in drawn.items():
        assert again[model].keys() == first.keys(), model
        for name, (image, caption) in first.items():
            image_again, caption_again = again[model][name]
            if caption_again != caption or (image is None) != (image_again is None) \
                    or image is not None and not np.array_equal(image_again, image):
                changed.append(f"{model} {name}")
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
