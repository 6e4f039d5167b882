"""vitviz.atlas: the concept atlas, a static site.

The site of a tiny dictionary built here (random weights, an exemplar index over twelve synthetic pictures of three
classes, one of them named like HTML, pictures, metrics, a class circuit) is read back as a browser would: every
link and image it refers to is a file of the site, nothing is fetched from elsewhere, what a page shows is what the
files it was made of hold (the exemplar index's own images and ids, the circuit's numbers), and what came from a
person's folders shows as text. The class effects the atlas measures are checked against each image's effect
computed here another way (autograd through codes spliced into the bundled ViT), averaged with numpy.
"""
from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
import torch
from PIL import Image

from vitviz import concepts
from vitviz.atlas import build_atlas
from vitviz.atlas.effects import class_effects
from vitviz.atlas.site import webp_bytes
from vitviz.concepts import Origin, TopK
from vitviz.concepts.analysis.exemplars import build_exemplars, load_exemplars, save_exemplars
from vitviz.concepts.analysis.names import concept_names
from vitviz.concepts.files.own import checksum
from vitviz.data import Dataset
from vitviz.looks.pictures import Pictures, jpegs, pictures_of, save_pictures

EVIL = "<b onmouseover=alert(1)>"
CLASSES = ("red", EVIL, "blue")
N = 6


def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))


def synthetic_data(*, labelled: bool = True) -> Dataset:
    pictures = [picture(i) for i in range(12)]
    return Dataset(name="synthetic", ids=tuple(f"picture-{i}.png" for i in range(12)),
                   labels=tuple(i % 3 for i in range(12)) if labelled else None,
                   classes=CLASSES if labelled else None, source=pictures.__getitem__)


def tiny_dictionary(folder: Path, *, index: bool = True, looks: bool = True) -> TopK:
    """A random TopK dictionary of N concepts saved in `folder`, with an exemplar index over the synthetic data,
    pictures and metrics beside it."""
    g = torch.Generator().manual_seed(0)
    dictionary = TopK(8, N, k=2, origin=Origin(model="synthetic", block=0, tokens="patch"))
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(8, N, generator=g))
        rows = torch.randn(N, 8, generator=g)
        dictionary.W_dec.copy_(rows / rows.norm(dim=1, keepdim=True))
    dictionary.eval()
    concepts.save(dictionary, folder)
    if index:
        tokens = torch.randn(12, 4, 8, generator=g)
        batches = [(images, dictionary.encode(tokens[images])) for images in torch.arange(12).split(5)]
        save_exemplars(build_exemplars(dictionary, batches, synthetic_data(), grid=(2, 2), top=3,
                                       model="synthetic"), folder)
    if looks:
        encoded = jpegs(np.random.default_rng(1).random((N, 32, 32, 3)), np.ones((N, 32, 32)))
        offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(j) for j in encoded])]), dtype=torch.int64)
        state = {k: v.detach().cpu() for k, v in dictionary.state_dict().items()}
        save_pictures(Pictures(sets={"synthetic": (torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8),
                                                   offsets, torch.zeros(N, 2))},
                               n_concepts=N, settings={}, dictionary_sha256=checksum(state), seconds=0.0), folder)
    (folder / "metrics.json").write_text(json.dumps({"fvu": 0.25, "l0": 2.0, "dead": 0.0}))
    return dictionary


CIRCUIT_NODES = [(2, 0.51234), (4, -0.25), (0, 0.125)]


def class_circuit(folder: Path, dictionary_folder: Path) -> Path:
    """A class circuit of 'red' through the synthetic model, its site this dictionary's block."""
    nodes = [{"id": "input", "kind": "input", "name": "the photo"}]
    nodes += [{"id": f"b0/c{c}", "kind": "concept", "name": f"#{c}", "effect": e, "block": 0, "concept": c}
              for c, e in CIRCUIT_NODES]
    circuit = {"model": "synthetic", "target_label": "red", "nodes": nodes, "edges": [],
               "sites": [{"block": 0, "dictionary": str(dictionary_folder)}]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "class-circuit-synthetic-red.json"
    path.write_text(json.dumps(circuit))
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(the site's folder, the dictionary's folder, the circuit's file, the build's summary)."""
    tmp = tmp_path_factory.mktemp("atlas")
    folder = tmp / "tiny"
    tiny_dictionary(folder)
    circuit = class_circuit(tmp / "circuits", folder)
    summary = build_atlas([str(folder)], out=tmp / "site", data=synthetic_data(), circuits=[circuit],
                          app="https://example.org/app", progress=False)
    return tmp / "site", folder, circuit, summary


class Links(HTMLParser):
    """Every src and href of a page, each element's attributes, and its text."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str, dict]] = []
        self.attributes: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.attributes.append((tag, attrs))
        for key in ("src", "href"):
            if attrs.get(key) is not None:
                self.refs.append((tag, attrs[key], attrs))

    def handle_data(self, data):
        self.text.append(data)


def parsed(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text(encoding="utf-8"))
    return links


def test_every_local_link_and_image_of_the_site_resolves(site):
    root, _, _, _ = site
    pages = sorted(root.rglob("*.html"))
    assert len(pages) == 1 + 1 + N + len(CLASSES)   # the front page, the dictionary's, a page per concept and class
    checked = 0
    for page in pages:
        for tag, ref, _ in parsed(page).refs:
            if ref.startswith(("data:", "https://example.org/app?")) or ref == "https://example.org/app":
                continue
            target = (page.parent / ref.split("#")[0]).resolve()
            assert target.is_file() and root.resolve() in target.parents, f"{page.name}: {tag} {ref} is not in the site"
            checked += 1
    assert checked > 100


def test_no_page_or_stylesheet_fetches_anything_from_the_network(site):
    root, _, _, _ = site
    for page in root.rglob("*.html"):
        for tag, ref, attrs in parsed(page).refs:
            if tag in ("img", "script") or (tag == "link" and attrs.get("rel") == "stylesheet"):
                assert not re.match(r"(?i)\s*(https?:)?//", ref), f"{page.name} fetches {ref}"
    for name in ("atlas.css", "atlas.js", "search-index.js"):
        content = (root / name).read_text(encoding="utf-8")
        assert not re.search(r"(?i)https?:|url\(|@import|fetch\(|XMLHttpRequest", content), name


def test_a_concept_page_holds_its_number_pictures_images_and_models(site):
    root, folder, _, _ = site
    index = load_exemplars(folder)
    for concept in range(N):
        page = root / "tiny" / "concepts" / f"{concept}.html"
        links = parsed(page)
        text = "".join(links.text)
        assert f"Concept {concept} of" in text and "synthetic" in text
        sources = [ref for tag, ref, _ in links.refs if tag == "img"]
        assert f"../../tiny/pictures/synthetic-{concept}.jpg" in sources
        # the concept's picture with its own map applied (`looks.transparent`), as the site writes it (lossy WebP)
        masked = (page.parent / f"../../tiny/pictures/synthetic-{concept}-masked.webp").read_bytes()
        assert masked == webp_bytes(pictures_of(folder).transparent(concept))
        opening = next(ref for tag, ref, _ in links.refs if tag == "a" and ref.startswith("https://example.org/app"))
        assert parse_qs(urlsplit(opening).query) == {"dictionary": [str(folder)], "concept": [str(concept)]}
        expected = [e for e in index.of(concept)]
        shown = [ref for ref in sources if "/images/" in ref]
        assert [int(Path(ref).stem) for ref in shown] == [e.index for e in expected]
        for ref, exemplar in zip(shown, expected):   # the very thumbnail the index keeps
            assert exemplar.id in text
            on_page = np.asarray(Image.open(page.parent / ref).convert("RGB"))
            assert np.array_equal(on_page, np.asarray(exemplar.image))


def test_a_class_name_made_of_html_shows_as_text(site):
    root, _, _, _ = site
    evil_pages = 0
    for page in root.rglob("*.html"):
        content = page.read_text(encoding="utf-8")
        assert "<b onmouseover" not in content
        links = parsed(page)
        assert not any(key.startswith("on") for _, attrs in links.attributes for key in attrs)
        if EVIL in "".join(links.text):   # the text a browser shows, unescaped: the name as it was
            evil_pages += 1
    assert evil_pages >= 2   # its class page and the front page at least
    script = (root / "search-index.js").read_text(encoding="utf-8")
    assert "<" not in script and json.loads(script.split("=", 1)[1].rstrip().rstrip(";"))


def test_a_class_pages_signed_effects_equal_the_class_circuits_numbers(site):
    root, _, circuit, _ = site
    page = root / "tiny" / "classes" / "0-red.html"
    shown = {int(attrs["data-concept"]): float(attrs["data-effect"]) for tag, attrs in parsed(page).attributes
             if "data-effect" in attrs}
    nodes = {n["concept"]: n["effect"] for n in json.loads(circuit.read_text())["nodes"] if n["kind"] == "concept"}
    assert shown == nodes
    text = "".join(parsed(page).text)
    assert "red: #2 and #0 in synthetic." in text   # the two builders, strongest first
    blue = "".join(parsed(root / "tiny" / "classes" / "2-blue.html").text)
    assert "no class circuit" in blue   # no circuit, and the synthetic model cannot be run: said, not broken


def test_measured_effects_show_on_the_class_and_concept_pages_as_measured(site, tmp_path, monkeypatch):
    from vitviz.atlas import site as building
    from vitviz.atlas.effects import ClassEffects

    _, folder, _, _ = site
    rng = np.random.default_rng(2)
    mean = rng.normal(size=(len(CLASSES), N)).round(4).tolist()
    half = rng.uniform(0.01, 0.1, size=(len(CLASSES), N)).round(4).tolist()
    made = ClassEffects(model="synthetic", classes=list(CLASSES), images=[4, 4, 4], mean=mean, half=half)
    asked = []
    monkeypatch.setattr(building.measured, "class_effects",
                        lambda *args, **kwargs: asked.append(kwargs["indices"]) or [made])
    out = tmp_path / "site"
    build_atlas([str(folder)], out=out, data=synthetic_data(), circuits=[], limit=6, progress=False)
    assert asked == [[0, 2, 4, 7, 9, 11]]   # 6 images spread over the 12
    k = CLASSES.index("blue")
    assert any(m > 0 for m in mean[k]) and any(m < 0 for m in mean[k])   # builders and concepts against
    page = parsed(out / "tiny" / "classes" / f"{k}-blue.html")
    shown = [(int(a["data-concept"]), float(a["data-effect"])) for _, a in page.attributes if "data-effect" in a]
    builders = sorted(((c, m) for c, m in enumerate(mean[k]) if m > 0), key=lambda e: -e[1])
    against = sorted(((c, m) for c, m in enumerate(mean[k]) if m < 0), key=lambda e: e[1])[:3]
    assert shown == builders + against
    assert "95 % interval" in "".join(page.text) and f"± {half[k][shown[0][0]]:.2g}" in "".join(page.text)
    concept = parsed(out / "tiny" / "concepts" / "1.html")
    assert [float(a["data-effect"]) for _, a in concept.attributes if "data-effect" in a] == [m[1] for m in mean]
    again = build_atlas([str(folder)], out=out, data=synthetic_data(), circuits=[], limit=6, progress=False)
    assert len(asked) == 1 and again.written == 0   # the effects read back, not measured again


def test_each_concepts_json_holds_neuronpedias_fields_from_the_index(site):
    root, folder, _, _ = site
    index = load_exemplars(folder)
    names = concept_names(index)
    for concept in range(N):
        record = json.loads((root / "tiny" / "concepts" / f"{concept}.json").read_text())
        assert record["index"] == concept and record["name"] == names[concept].words
        assert record["frac_nonzero"] == {"synthetic": float(index.frequency[concept])}
        assert [a["image_id"] for a in record["activations"]] == [e.id for e in index.of(concept)]
        assert [a["maxValue"] for a in record["activations"]] == pytest.approx([e.value for e in index.of(concept)])
        assert all((root / a["image"]).is_file() for a in record["activations"])
        assert all((root / p).is_file() for p in record["pictures"].values()) and record["pictures"]


def test_the_front_page_lists_the_dictionary_its_metrics_and_classes(site):
    root, _, _, summary = site
    text = "".join(parsed(root / "index.html").text)
    assert "tiny" in text and "0.250" in text and "red" in text and EVIL in text
    assert summary.concepts == N and summary.classes == len(CLASSES)
    readme = (root / "README.md").read_text()
    assert readme.startswith("---\n") and "\nsdk: static\n" in readme.split("---")[1]


def test_building_again_writes_only_what_is_missing(site, tmp_path):
    _, folder, circuit, _ = site
    out = tmp_path / "site"
    build = lambda: build_atlas([str(folder)], out=out, data=synthetic_data(), circuits=[circuit],  # noqa: E731
                                progress=False)
    first = build()
    (out / "tiny" / "concepts" / "3.html").unlink()
    again = build()
    assert first.written == 2 * N + 1 + len(CLASSES) and first.kept == 0
    assert again.written == 1 and again.kept == first.written - 1
    assert (out / "tiny" / "concepts" / "3.html").is_file()


def test_a_dictionary_without_an_exemplar_index_gets_a_sentence_not_a_crash(tmp_path):
    folder = tmp_path / "bare"
    tiny_dictionary(folder, index=False, looks=False)
    summary = build_atlas([str(folder)], out=tmp_path / "site", data=synthetic_data(labelled=False),
                          circuits=[], progress=False)
    words = " ".join(summary.notes)
    assert "concepts exemplars" in words and "looks --pictures" in words and "no labels" in words
    front = "".join(parsed(tmp_path / "site" / "index.html").text)
    assert "concepts exemplars" in front
    page = tmp_path / "site" / "bare" / "concepts" / "1.html"
    assert "concepts exemplars" in "".join(parsed(page).text)
    assert not (tmp_path / "site" / "bare" / "classes").exists()   # no labels: the class pages left out


def test_a_dictionary_that_cannot_be_read_is_refused_in_words(tmp_path):
    with pytest.raises(concepts.ConceptsError, match="left out"):
        build_atlas([str(tmp_path / "nothing")], out=tmp_path / "site", progress=False)


def test_the_command_builds_the_site_and_says_what_is_missing_in_words(tmp_path, capsys):
    from vitviz.cli import main

    folder = tmp_path / "bare"
    tiny_dictionary(folder, index=False)
    assert main(["atlas", "--dictionaries", str(folder), "--out", str(tmp_path / "site")]) == 0
    out, err = capsys.readouterr()
    assert f"{N} concept pages and 0 class pages" in out
    assert "note: " in err and "concepts exemplars" in err and "No data set given" in err
    assert (tmp_path / "site" / "bare" / "concepts" / f"{N - 1}.html").is_file()
    assert main(["atlas", "--dictionaries", str(folder), "--circuits", str(tmp_path / "none"),
                 "--out", str(tmp_path / "site")]) == 2
    assert "--circuits" in capsys.readouterr().err


def test_the_search_finds_by_shared_exactly_the_concepts_every_model_shares():
    from vitviz import catalog
    from vitviz.atlas.facts import gather
    from vitviz.atlas.front import search_entries
    from vitviz.atlas.pages import Context

    metrics = json.loads((catalog.BUNDLED_DICTIONARIES["across-cifar10"].path / "metrics.json").read_text())
    entries = search_entries([gather("across-cifar10", circuits=[], matches=[])], Context(classes=None))
    assert len(entries) == 768
    assert [c for _, c, _, words, _ in entries if "shared" in words.split()] == metrics["shared_concepts"]
    own = [c for _, c, _, words, _ in entries if "own resnet-cifar10" in words]
    assert own == metrics["specific_concepts"]["resnet-cifar10"]


def test_the_apps_concept_table_links_a_concept_to_its_page_in_the_atlas_it_serves(site, monkeypatch):
    from vitviz.ui.concept_words import concept_cell

    root, folder, _, _ = site
    monkeypatch.setenv("VITVIZ_ATLAS", str(root))
    assert concept_cell(str(folder), 2) == "[2](/atlas/tiny/concepts/2.html)"
    assert concept_cell(str(folder), N) == str(N)   # no page of that number
    monkeypatch.setenv("VITVIZ_ATLAS", str(root.parent / "no-atlas-here"))
    assert concept_cell(str(folder), 2) == "2"


# ---- the effects measured, against autograd through spliced codes --------------------------------------------

def spliced_effects(loaded, dictionary, image, target: int) -> np.ndarray:
    """Each concept's effect on the logit of `target` minus the mean logit, on one image: the block's tokens
    replaced by decode(z) + (tokens - decode(z)) with z a leaf, and dm/dz · z summed over the tokens."""
    block = dictionary.block
    kept = {}

    def edit(index, tokens):
        if index != block:
            return tokens
        codes = dictionary.encode(tokens).detach().requires_grad_(True)
        kept["codes"] = codes
        error = (tokens - dictionary.decode(codes)).detach()
        return dictionary.decode(codes) + error

    pixels = loaded.preprocess(image)
    logits = loaded.model.trace(pixels, grad=True, attention=False, edit=edit).logits
    m = logits[0, target] - logits[0].mean()
    (grad,) = torch.autograd.grad(m, kept["codes"])
    return (grad * kept["codes"]).sum((0, 1)).detach().double().numpy()


def test_measured_class_effects_are_each_images_effect_averaged_with_a_95_percent_interval(one_torch_thread,
                                                                                            cifar10_test):
    from vitviz import hub

    loaded = hub.load("vit-cifar10")
    dictionary = concepts.load("vit-cifar10-last")
    assert dictionary.origin.tokens == "patch+cls"   # the reference splices every token of the block
    labels = cifar10_test.labels
    indices = [i for i, k in enumerate(labels) if k == 3][:3] + [i for i, k in enumerate(labels) if k == 5][:2]
    found = class_effects("vit-cifar10-last", dictionary, cifar10_test, models=["vit-cifar10"], indices=indices,
                          progress=False)[0]
    for k, name in ((3, "cat"), (5, "dog")):
        per_image = np.stack([spliced_effects(loaded, dictionary, cifar10_test.image(i), k)
                              for i in indices if labels[i] == k])
        row = found.classes.index(name)
        assert found.images[row] == len(per_image)
        np.testing.assert_allclose(found.mean[row], per_image.mean(0), rtol=2e-4, atol=1e-6)
        half = 1.959964 * per_image.std(0, ddof=1) / np.sqrt(len(per_image))   # 1.96: the normal's 97.5 % point
        np.testing.assert_allclose(found.half[row], half, rtol=2e-4, atol=1e-6)
    assert sum(found.images) == len(indices)
    assert found.images[found.classes.index("airplane")] == 0


# ---- in a browser -------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 390])
def test_in_chromium_search_finds_a_concept_by_a_class_word_and_its_images_load(site, width):
    from playwright.sync_api import sync_playwright

    from tests.app_server import SCREENSHOTS, launch_browser

    root, folder, _, _ = site
    names = concept_names(load_exemplars(folder))
    wanted = {n.concept for n in names if "blue" in n.words}
    assert wanted, "the tiny dictionary names no concept after 'blue'"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = launch_browser(p)
        page = browser.new_page(viewport={"width": width, "height": 1000 if width > 600 else 844})
        page.goto((root / "index.html").as_uri())
        page.locator("#search").fill("blue")
        results = page.locator("#found a")
        results.first.wait_for(timeout=5_000)
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        found = {int(Path(h).stem) for h in hrefs if "/concepts/" in h}
        assert found == wanted
        page.screenshot(path=str(SCREENSHOTS / f"atlas-search-{width}.png"))
        results.first.click()
        page.wait_for_load_state("load")
        assert "/concepts/" in page.url
        images = page.locator("img")
        assert images.count() >= 2
        sizes = page.evaluate("() => Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert all(complete and w > 0 for complete, w in sizes), sizes
        page.screenshot(path=str(SCREENSHOTS / f"atlas-concept-{width}.png"), full_page=True)
        page.goto((root / "tiny" / "classes" / "0-red.html").as_uri())
        sizes = page.evaluate("() => Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert len(sizes) == len(CIRCUIT_NODES) and all(complete and w > 0 for complete, w in sizes), sizes
        page.screenshot(path=str(SCREENSHOTS / f"atlas-class-{width}.png"), full_page=True)
        browser.close()


@pytest.mark.slow
def test_the_app_serves_a_built_atlas_under_atlas_and_stays_itself_at_its_root(site, tmp_path):
    import urllib.request

    from tests.app_server import launch
    from vitviz.catalog import BUNDLED_PAIR

    root, _, _, _ = site
    server = launch(tmp_path, "--vit", BUNDLED_PAIR[0], "--cvt", BUNDLED_PAIR[1], env={"VITVIZ_ATLAS": str(root)})
    try:
        for path, file in (("atlas/", "index.html"), ("atlas/tiny/concepts/2.html", "tiny/concepts/2.html"),
                           ("atlas/atlas.css", "atlas.css")):
            with urllib.request.urlopen(server.url + path, timeout=10) as response:
                assert response.status == 200 and response.read() == (root / file).read_bytes()
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert b"gradio" in response.read().lower()   # the app itself, still at its root
    finally:
        server.stop()


def test_thumbnails_on_the_pages_are_jpegs(site):
    root, _, _, _ = site
    files = sorted((root / "images").rglob("*.jpg"))
    assert files and all(Image.open(io.BytesIO(f.read_bytes())).format == "JPEG" for f in files)


def test_a_concept_across_models_shows_the_table_of_how_each_models_picture_excites_it(tmp_path):
    """Of a dictionary across models, a concept's page and JSON show the table its pictures file holds, cell by
    cell (a percentile not above 0 as a dash), with the strongest and weakest readings in words; without the table,
    a sentence saying what to run."""
    import shutil

    from vitviz.atlas.facts import gather
    from vitviz.atlas.pages import Context, concept_page, concept_record
    from vitviz.concepts.files import folder_of
    from vitviz.looks.alike import Tables

    folder = tmp_path / "across"
    shutil.copytree(folder_of("across-vit-cvt-cifar10"), folder, ignore=shutil.ignore_patterns("exemplars-*"))
    models, sets = ("vit-cifar10", "cvt-cifar10"), ("shared", "vit-cifar10", "cvt-cifar10")
    n = 3
    encoded = jpegs(np.random.default_rng(1).random((n, 32, 32, 3)), np.ones((n, 32, 32)))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(j) for j in encoded])]), dtype=torch.int64)
    jpeg = torch.frombuffer(bytearray(b"".join(encoded)), dtype=torch.uint8)
    pictures = Pictures(sets={name: (jpeg.clone(), offsets.clone(), torch.zeros(n, 2)) for name in sets}, n_concepts=n,
                        settings={}, dictionary_sha256="-", seconds=0.0)
    save_pictures(pictures, folder)
    facts = gather(str(folder))
    assert any("--alike` measures it" in p for p in facts.problems)
    assert "--alike` measures it" in concept_page(facts, 1, Context(classes=None))

    values = np.arange(n * 3 * 2, dtype=np.float64).reshape(n, 3, 2) / 4 + 0.25   # exact in float32
    values[1, 2, 0] = np.nan
    tables = Tables(sets=sets, models=models, values=values, percentiles=np.full((n, 2), 0.5),
                    data="100 test images of cifar10")
    save_pictures(Pictures(**{**vars(pictures), "tables": tables}), folder)
    facts = gather(str(folder))
    links = Links()
    links.feed(concept_page(facts, 1, Context(classes=None)))
    shown = "".join(links.text)
    assert "Do the models see it alike?" in shown
    for name, row in zip(("the shared picture", "vit-cifar10's own", "cvt-cifar10's own"), values[1]):
        cells = [f"{v:.1f}x" if np.isfinite(v) else "–" for v in row]
        assert name + "".join(cells) in shown
    # the CvT's picture is not read in the ViT (its percentile there stands for one not above 0): one reading is left
    assert ("vit-cifar10's picture excites concept 1 in cvt-cifar10 at 2.5x its 99th percentile on 100 test images "
            "of cifar10.") in shown
    record = concept_record(facts, 1, Context(classes=None))["alike"]
    assert record["pictures"]["cvt-cifar10"] == {"vit-cifar10": None, "cvt-cifar10": pytest.approx(values[1, 2, 1])}
    assert record["pictures"]["shared"]["vit-cifar10"] == pytest.approx(values[1, 0, 0])
