"""Building the site: every dictionary's facts gathered, the class effects measured where no class circuit gives
them, and every page, picture, image and JSON written into one folder.

    summary = build_atlas(["across-cifar10"], data=open_data("cifar10"), limit=500, out="site")

The folder:

    index.html, atlas.css, atlas.js      the front page, the style, the search (static, from vitviz/atlas/static/)
    search-index.js, search.json         the search's entries (`front.py`)
    README.md                            the front matter of a static Hugging Face Space, and what is here
    images/<data>/<index>.jpg            each top image's thumbnail, once, as the exemplar index keeps it (JPEG)
    <dictionary>/index.html              all its concepts
    <dictionary>/concepts/<c>.html, .json  a page per concept and its JSON (`pages.py`)
    <dictionary>/classes/<k>-<name>.html a page per class (`classes.py`)
    <dictionary>/pictures/<set>-<c>.jpg  its pictures, as the pictures file keeps them (JPEG), and
    <dictionary>/pictures/<set>-<c>-masked.webp  with their transparency maps applied, on the pages' paper (WebP)
    <dictionary>/class-effects.json      the effects measured (`effects.py`)

Building again adds what is missing: the pictures and images already there are kept, the effects are read back
when they were measured on the same weights and images, and a dictionary's pages are written again only when
what they are made of (`inputs`: the files read, and the code that writes them; a digest kept in
`<dictionary>/.atlas-inputs`) changed, or they are missing.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from .. import catalog
from ..concepts import ConceptsError
from ..data import Dataset, spread
from ..files import write_atomic
from ..hub.loaded import LoadError
from . import effects as measured
from .classes import class_page
from .facts import Facts, gather, match_folders
from .front import front_page, search_entries
from .html import SEARCH, script_json, text
from .pages import (
    APP,
    Context,
    class_path,
    concept_json,
    concept_page,
    concept_path,
    concept_record,
    dictionary_page,
    picture_path,
    thumbnail_path,
)

STATIC = Path(__file__).with_name("static")
INPUTS = ".atlas-inputs"
PAPER = tuple(bytes.fromhex(re.search(r"--paper: #([0-9a-f]{6})", (STATIC / "atlas.css").read_text())[1]))   # its RGB
README = """---
title: vitviz concept atlas
emoji: 🔭
colorFrom: indigo
colorTo: gray
sdk: static
app_file: index.html
pinned: false
---

# vitviz concept atlas

A static site made by `vitviz atlas`: plain HTML, one stylesheet and a little JavaScript, every file local (it
opens from the folder itself too). Open `index.html`. Every concept of {dictionaries} has a page of its own
(`<dictionary>/concepts/<number>.html`) and its JSON beside it; every class a page per dictionary
(`<dictionary>/classes/`). The search reads
`search-index.js`; `search.json` holds the same entries.
"""


@dataclass
class Summary:
    """What a build did: pages written and kept, the effects measured, the sentences about what is missing."""
    written: int = 0
    kept: int = 0
    concepts: int = 0
    classes: int = 0
    measured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def build_atlas(dictionaries: Sequence[str], *, out: str | Path, data: Dataset | None = None,
                limit: int | None = None, circuits: Sequence[Path] | None = None, app: str = APP,
                progress: bool = True) -> Summary:
    """The atlas of `dictionaries` (bundled names or folders) written into `out` (the module docstring). `data`:
    the labelled images the class effects are measured over (`limit` of them spread over it); `circuits`: class
    circuit files (by default the bundled ones); `app`: the app's address, from a concept's page."""
    start = time.perf_counter()
    out = Path(out)
    summary = Summary()
    if not dictionaries:
        raise ConceptsError("Name at least one dictionary for the atlas.")
    circuits = sorted(catalog.CLASS_CIRCUITS.glob("class-circuit-*.json")) if circuits is None else list(circuits)
    matches = match_folders(dictionaries)
    all_facts = []
    for source in dictionaries:
        try:
            all_facts.append(gather(source, circuits=circuits, matches=matches))
        except ConceptsError as e:
            summary.notes.append(f"{source} is left out: {e}")
    if not all_facts:
        raise ConceptsError(" ".join(summary.notes))
    slugs = [f.slug for f in all_facts]
    if len(set(slugs)) != len(slugs):
        raise ConceptsError(f"Two dictionaries would share a folder in the site ({', '.join(slugs)}): give "
                            f"folders of different names.")
    classes = None
    if data is None:
        summary.notes.append("No data set given: the class pages are left out (--data with labelled images).")
    elif data.labels is None or data.classes is None:
        summary.notes.append(f"{data.name} has no labels: the class pages are left out; give labelled images "
                             f"(a folder of class sub-folders, an .npz with labels, or cifar10).")
    else:
        classes = list(data.classes)
    context = Context(classes=classes, app=app,
                      slugs={(f.models[0], f.block): f.slug for f in all_facts if not f.across})
    if classes is not None:
        for facts in all_facts:
            context.effects[facts.slug] = _effects(facts, data, limit, out, summary, progress)
    _write_static(out)
    pages = sum(2 * f.n_concepts + 1 + len(classes or ()) for f in all_facts)
    with tqdm(total=pages, desc="atlas pages", unit="page", disable=not progress) as bar:
        for facts in all_facts:
            _write_dictionary(facts, context, out, summary, bar)
    write_atomic(out / "index.html", front_page(all_facts, context, summary.notes).encode())   # each dictionary's
    summary.notes = [f"{f.source}: {p}" for f in all_facts for p in f.problems] + summary.notes  # problems in its part
    entries = search_entries(all_facts, context)
    write_atomic(out / SEARCH, f"window.ATLAS_SEARCH = {script_json(entries)};\n".encode())
    write_atomic(out / "search.json", json.dumps(entries, ensure_ascii=False).encode())
    write_atomic(out / "README.md", README.format(dictionaries=text(", ".join(f.source for f in all_facts))).encode())
    summary.concepts = sum(f.n_concepts for f in all_facts)
    summary.classes = len(classes or ()) * len(all_facts)
    summary.seconds = time.perf_counter() - start
    return summary


def _effects(facts: Facts, data: Dataset, limit: int | None, out: Path, summary: Summary,
             progress: bool) -> list[measured.ClassEffects]:
    """The class effects of the models without a class circuit at this dictionary's block: read back when kept
    from the same inputs, else measured and kept."""
    with_circuits = {node.model for node in facts.circuits}
    models = [m for m in facts.models if m not in with_circuits]
    if not models:
        return []
    indices = spread(len(data), limit)
    inputs = measured.measured_on(facts.sha256, data, indices) | {"models": models}
    folder = out / facts.slug
    kept = measured.saved(folder, inputs)
    if kept is not None:
        return kept
    try:
        found = measured.class_effects(facts.source, facts.dictionary, data, models=models, indices=indices,
                                       progress=progress)
    except (ConceptsError, LoadError) as e:
        facts.problems.append(f"Its effects on the classes cannot be measured: {e}")
        return []
    measured.save(folder, found, inputs)
    summary.measured.append(f"{facts.source}: {', '.join(models)} over {len(indices)} images")
    return found


def inputs(facts: Facts, context: Context) -> str:
    """A digest of everything a dictionary's pages are made of: a change rewrites them."""
    record = {
        "code": _code(), "dictionary": facts.sha256, "source": facts.source,
        "indexes": {m: [i.dictionary_sha256, i.data, i.tokens, i.images.tolist(), list(i.ids)]
                    for m, i in facts.indexes.items()},
        "pictures": None if facts.pictures is None else [
            facts.pictures.dictionary_sha256, facts.pictures.settings, list(facts.pictures.sets),
            facts.pictures.drawing, facts.pictures.seconds, None if facts.pictures.tables is None else
            hashlib.sha256(facts.pictures.tables.values.tobytes()).hexdigest()],
        "metrics": facts.metrics, "partners": {c: [vars(p) for p in ps] for c, ps in facts.partners.items()},
        "circuits": [vars(n) for n in facts.circuits], "problems": facts.problems,
        "classes": context.classes, "effects": [asdict(e) for e in context.effects.get(facts.slug, ())],
        "slugs": sorted(map(list, context.slugs.items()), key=str), "app": context.app}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def _code() -> str:
    """A digest of the code that writes the pages (this package's modules and static files): pages written by
    another version are written again."""
    digest = hashlib.sha256()
    for path in sorted([*Path(__file__).parent.glob("*.py"), *STATIC.iterdir()]):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _write_dictionary(facts: Facts, context: Context, out: Path, summary: Summary, bar) -> None:
    digest = inputs(facts, context)
    marker = out / facts.slug / INPUTS
    same = marker.is_file() and marker.read_text() == digest

    def write(relative: str, make, *args) -> None:
        path = out / relative
        if same and path.is_file():
            summary.kept += 1
        else:
            content = make(*args)
            write_atomic(path, content if isinstance(content, bytes) else content.encode())
            summary.written += 1
        bar.update(1)
    _write_pictures(facts, out, keep=same)
    _write_thumbnails(facts, out)
    for c in range(facts.n_concepts):
        write(concept_path(facts.slug, c), concept_page, facts, c, context)
        write(concept_json(facts.slug, c), _record_json, facts, c, context)
    write(f"{facts.slug}/index.html", dictionary_page, facts)
    for k, name in enumerate(context.classes or ()):
        write(class_path(facts.slug, k, name), class_page, facts, k, name, context)
    write_atomic(marker, digest.encode())


def _record_json(facts: Facts, concept: int, context: Context) -> str:
    return json.dumps(concept_record(facts, concept, context), ensure_ascii=False, separators=(",", ":"))


def _write_pictures(facts: Facts, out: Path, *, keep: bool) -> None:
    """Each picture's JPEG as the pictures file holds it, and the picture with its transparency map applied
    (`looks.transparent`) on the pages' paper (`webp_bytes`)."""
    if facts.pictures is None:
        return
    for name, (jpeg, offsets, _) in facts.pictures.sets.items():
        for c in range(min(facts.n_concepts, facts.pictures.n_concepts)):
            path, masked = (out / picture_path(facts.slug, name, c, masked=m) for m in (False, True))
            if keep and path.is_file() and masked.is_file():
                continue
            a, b = int(offsets[2 * c]), int(offsets[2 * c + 1])
            write_atomic(path, jpeg[a:b].numpy().tobytes())
            write_atomic(masked, webp_bytes(facts.pictures.transparent(c, name)))


def webp_bytes(rgba) -> bytes:
    """An RGBA picture laid on the pages' paper (`PAPER`, atlas.css's --paper) as WebP, quality 70: what a browser
    shows of it, at a third of the bytes of the picture with its alpha."""
    on_paper = Image.new("RGB", (rgba.shape[1], rgba.shape[0]), PAPER)
    on_paper.paste(Image.fromarray(rgba), mask=Image.fromarray(rgba[..., 3]))
    buffer = io.BytesIO()
    on_paper.save(buffer, format="WEBP", quality=70)
    return buffer.getvalue()


def _write_thumbnails(facts: Facts, out: Path) -> None:
    """Each top image's thumbnail as its exemplar index holds it, once per data set image."""
    for index in facts.indexes.values():
        offsets = index.thumbnail_offsets.tolist()
        for k, image in enumerate(index.thumbnail_images.tolist()):
            path = out / thumbnail_path(index.data, image)
            if not path.is_file():
                write_atomic(path, index.thumbnail_jpeg[offsets[k]:offsets[k + 1]].numpy().tobytes())


def _write_static(out: Path) -> None:
    """The stylesheet and the script, copied from the package."""
    out.mkdir(parents=True, exist_ok=True)
    for file in sorted(STATIC.iterdir()):
        if file.is_file():
            shutil.copyfile(file, out / file.name)
