"""A link opening the app on a concept (`?dictionary=NAME&concept=N`, the atlas's "open the app on it"): the Concepts
tab with the dictionary in the columns of its models and the concept's card first, on any photo; a link the app
cannot follow changes nothing and says why."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import gradio as gr
import pytest

from tests.app_server import SCREENSHOTS, explained_page, launch
from vitviz.atlas.pages import app_address
from vitviz.catalog import BUNDLED_PAIR
from vitviz.ui import concepts, linked, page

PHOTO = Path(__file__).resolve().parents[1] / "assets" / "cat_chelsea.jpg"
ACROSS = "across-vit-cvt-cifar10"
QUIET = dict(progress=lambda *a, **k: None)


def opened(query: str, pair=BUNDLED_PAIR) -> tuple:
    return linked.opened(*pair, SimpleNamespace(query_params=dict(
        part.split("=", 1) for part in urlsplit(query).query.split("&") if part)))


def test_a_link_selects_the_concepts_tab_with_the_dictionary_and_pins_the_concept():
    a, b, tabs, box_a, box_b, pinned, words, is_open = opened(app_address("/", ACROSS, 5))
    assert (a, b) == BUNDLED_PAIR and tabs.selected == "concepts" and is_open
    assert box_a.value == box_b.value == ACROSS and pinned == (ACROSS, 5)
    assert f"Opened on **concept 5** of **{ACROSS}**" in words
    # a dictionary of one model: that model on the left, the right one as it was
    a, b, _, box_a, box_b, pinned, _, _ = opened(app_address("/", "swin-cifar10-last", 7))
    assert (a, b) == ("swin-cifar10", BUNDLED_PAIR[1]) and box_a.value == "swin-cifar10-last"
    assert box_b == gr.skip() and pinned == ("swin-cifar10-last", 7)
    # across four models, the page's pair kept where both read it; else its first two
    a, b, *_ = opened(app_address("/", "across-cifar10", 3), pair=("swin-cifar10", "resnet-cifar10"))
    assert (a, b) == ("swin-cifar10", "resnet-cifar10")
    a, b, *_ = opened(app_address("/", "across-cifar10", 3), pair=("deit-tiny", "resnet-cifar10"))
    assert (a, b) == ("vit-cifar10", "cvt-cifar10")


@pytest.mark.parametrize("query, words", [
    ("?dictionary=nothing-of-the-kind&concept=5", "no dictionary named 'nothing-of-the-kind'"),
    (f"?dictionary={ACROSS}&concept=-1", "a concept is a whole number from 0, not '-1'"),
    (f"?dictionary={ACROSS}&concept=768", f"{ACROSS} has 768 concepts (0 to 767), no concept 768"),
])
def test_a_link_the_app_cannot_follow_changes_nothing_and_says_why(query, words):
    *changed, said, is_open = opened(query)
    assert all(part == gr.skip() for part in (*changed, is_open)) and words in said


def test_without_a_link_the_page_opens_as_it_always_does():
    assert all(part == gr.skip() for part in opened("/"))


def test_the_pinned_concepts_card_comes_first_with_what_it_does_on_the_photo():
    """Concept c, the fourth card unpinned, comes first pinned, with the same numbers; a concept that does not fire
    on the photo comes first too, its code 0 everywhere."""
    key = page.explain({"path": str(PHOTO)}, *BUNDLED_PAIR, **QUIET).key
    plain = concepts.reading(key, ACROSS, ACROSS)
    column = plain.columns[0]
    c = int(column.concepts[3])
    pinned = concepts.reading(key, ACROSS, ACROSS, (ACROSS, c))
    for before, after in zip(plain.columns, pinned.columns):
        assert int(after.concepts[0]) == c and list(after.concepts[1:]) == [x for x in before.concepts if x != c]
        k = list(before.concepts).index(c)
        assert after.activation[0] == pytest.approx(before.activation[k])
        assert (after.maps[0] == before.maps[k]).all()
    fires = {int(x) for col in plain.columns for cell in col.at_cells for x, _ in cell}
    quiet = next(x for x in range(768) if x not in fires and all(x not in col.concepts for col in plain.columns))
    shown = concepts.render_concepts(key, ACROSS, ACROSS, (ACROSS, quiet))
    assert int(shown.concepts_a[0][1]) == quiet and int(shown.concepts_b[0][1]) == quiet
    assert concepts.reading(key, ACROSS, ACROSS, (ACROSS, quiet), compute=False).columns[0].activation[0] == 0


@pytest.mark.slow
def test_in_chromium_a_link_opens_the_concepts_tab_on_the_concept(tmp_path):
    server = launch(tmp_path, "--vit", BUNDLED_PAIR[0], "--cvt", BUNDLED_PAIR[1])
    try:
        with explained_page(server.url + app_address("", ACROSS, 5).lstrip("/"), PHOTO) as browser_page:
            tab = browser_page.get_by_role("tab", name="Concepts")
            assert tab.get_attribute("aria-selected") == "true"
            browser_page.locator("#concepts-pick").get_by_text("Opened on concept 5").wait_for(timeout=10_000)
            first = browser_page.locator("#concepts-words-a table tbody tr").first.locator("td").first
            first.wait_for(timeout=120_000)   # the tab reads the concepts on the Explain: it is the open one
            assert first.inner_text().strip() == "5"
            browser_page.locator("#concepts-pick").scroll_into_view_if_needed()
            browser_page.screenshot(path=str(SCREENSHOTS / "linked-concept.png"))
    finally:
        server.stop()
