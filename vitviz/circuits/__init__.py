"""Circuits of concepts: which concepts, at which blocks and where on the photo, build a model's answer.

    from vitviz import hub
    from vitviz.circuits import Metric, photo_circuit
    loaded = hub.load("vit-cifar10")
    graph = photo_circuit(loaded, image, dictionaries=catalog.CIRCUIT_DICTIONARIES["vit-cifar10"])
    graph.to_json()     # nodes (concepts, errors, input, logit), edges, faithfulness, size

Per-block dictionaries spliced into the model at their blocks (`sites.py`: every family, the trace and the
dictionaries only), node and edge effects on the target's logit (`effects.py`: attribution patching, integrated
gradients, vector-Jacobian products between consecutive sites), pruning and the graph as data (`graph.py`), the
faithfulness of the result (`circuit.py`, `prefixes.py`), the circuit with a node a concept at one cell of the
photo (`positions.py`: `photo_circuit(..., positions=True)`), and the circuit kept whole to be pruned again at any size
on the host, as one safetensors file (`adjacency.py`: `graph.adjacency`, `resized(graph.adjacency, nodes=40)`).
`../shared/CIRCUITS.md` and each module's docstring give the formulas.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch
from PIL import Image

from ..concepts.files import folder_of
from ..concepts.kinds.dictionary import ConceptsError
from .adjacency import Adjacency, load_adjacency, resized, save_adjacency
from .circuit import circuit, faithfulness_over, patching_check, rank_correlation
from .effects import BASELINES, IG_STEPS, METHODS, METRICS, Metric
from .graph import EDGE_SHARE, FAITHFUL, MOST, Circuit, Edge, Node
from .positions import position_circuit
from .prefixes import prefix_faithfulness
from .sites import Site, image_sites, sites_of

__all__ = ["Adjacency", "BASELINES", "Circuit", "EDGE_SHARE", "Edge", "FAITHFUL", "IG_STEPS", "METHODS", "METRICS",
           "MOST", "Metric", "Node", "Site", "circuit", "data_class_circuit", "data_faithfulness", "faithfulness_over",
           "load_adjacency", "load_dictionaries", "metric_of", "patching_check", "photo_circuit",
           "position_circuit", "prefix_faithfulness", "rank_correlation", "resized", "save_adjacency", "sites_of"]


def load_dictionaries(sources: Sequence[str | Path]) -> list[tuple[str, object, Path | None]]:
    """(source, dictionary, its folder) for each source: a bundled name, a folder or file, a Hub id; a folder of
    `block<N>` folders (what `concepts train --block A B C` writes) stands for each of them, in block order. A
    process reads each source once (a circuit a click must not read its dictionaries again)."""
    loaded = []
    for source in sources:
        path = Path(str(source)).expanduser()
        blocks = sorted(path.glob("block*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1) \
            if path.is_dir() and not any(path.glob("*.safetensors")) else []
        for one in blocks or [source]:
            loaded.append((str(one), _dictionary(str(one)), folder_of(one)))
    return loaded


@lru_cache(maxsize=64)
def _dictionary(source: str):
    from ..concepts import load

    return load(source)


def metric_of(kind: str, target: int, contrast: int | None = None) -> Metric:
    """The metric of a kind of `METRICS` for a class (and a contrast class, which 'contrast' needs and only it
    takes), refused in words."""
    if kind not in METRICS:
        raise ConceptsError(f"The metric is one of {', '.join(METRICS)}, not {kind!r}.")
    if (kind == "contrast") != (contrast is not None):
        raise ConceptsError("A contrast class goes with the metric 'contrast' (the class's logit minus the "
                            "contrast's), and that metric needs one.")
    return Metric(target, contrast, centred=kind == "logit minus mean")


def photo_circuit(loaded, image: Image.Image, *, dictionaries: Sequence[str | Path], target: int | None = None,
                  contrast: int | None = None, metric: str | None = None, names: bool = True,
                  positions: bool = False, **settings) -> Circuit:
    """The circuit of one photo through a loaded model with `dictionaries` (sources, in depth order): the target
    class by default the model's top one; the metric (`METRICS`) by default the logit minus the mean logit, or the
    contrast where one is given; `settings`: `circuit`'s keywords (with `positions`, `position_circuit`'s: a node a
    concept at one cell). Concept names from each dictionary's exemplar index where it has one."""
    pixels = loaded.preprocess(image).to(loaded.device)
    with torch.inference_mode():
        trace = loaded.model.trace(pixels, attention=False)
    if not trace.has_classifier:
        raise ConceptsError(f"{loaded.name} has no classifier: there is no answer for a circuit to build.")
    target = int(trace.logits[0].argmax()) if target is None else target
    found = load_dictionaries(dictionaries)
    sites = sites_of(loaded, trace, [(source, dictionary) for source, dictionary, _ in found],
                     image_size=(image.height, image.width), folders=[folder for _, _, folder in found])
    kind = metric or (METRICS[2] if contrast is not None else METRICS[1])
    return (position_circuit if positions else circuit)(
        loaded, pixels, sites, metric_of(kind, target, contrast),
        names=[concept_names(site) for site in sites] if names else None, **settings)


def data_faithfulness(loaded, data, *, dictionaries: Sequence[str | Path], indices: Sequence[int], **settings) -> dict:
    """`faithfulness_over` a data set's images `indices` with `dictionaries` (sources, in depth order), loaded once;
    `settings`: its keywords (baseline, method, steps, frozen, errors, progress)."""
    found = load_dictionaries(dictionaries)

    def sites_for(trace, image: Image.Image) -> list[Site]:
        return sites_of(loaded, trace, [(source, dictionary) for source, dictionary, _ in found],
                        image_size=(image.height, image.width), folders=[folder for _, _, folder in found])
    return faithfulness_over(loaded, data, sites_for, indices=indices, **settings)


def data_class_circuit(loaded, data, *, dictionaries: Sequence[str | Path], target: int, limit: int | None = None,
                       ranks=None, **settings) -> Circuit:
    """The class circuit (`classes.class_circuit`) of the model's class `target` over the images of `data` labelled
    with that class's name, `limit` of them spread evenly (all without), with `dictionaries` (sources, in depth
    order); `settings`: its keywords. Refused in words: data without labels or without the class."""
    from ..data import spread
    from .classes import class_circuit

    label = loaded.labels[target]
    if data.labels is None or data.classes is None:
        raise ConceptsError(f"{data.name} has no labels: a class circuit reads the images of the class.")
    if label not in data.classes:
        raise ConceptsError(f"{data.name} has no class {label!r} (its classes: {', '.join(data.classes[:12])}).")
    own = [i for i, k in enumerate(data.labels) if data.classes[k] == label]
    found = load_dictionaries(dictionaries)
    built: dict[tuple[int, int], list[Site]] = {}

    def sites_for(trace, image: Image.Image) -> list[Site]:   # a model's sites depend on the image's size alone
        size = (image.height, image.width)
        if size not in built:
            built[size] = sites_of(loaded, trace, [(source, dictionary) for source, dictionary, _ in found],
                                   image_size=size, folders=[folder for _, _, folder in found])
        return built[size]
    indices = [own[j] for j in spread(len(own), limit)]
    names = [concept_names(site) for site in image_sites(loaded, data.image(indices[0]), sites_for)[2]] \
        if indices else None   # the sites' concepts' names, from the first image's sites
    return class_circuit(loaded, data, sites_for, target=target, indices=indices, names=names, ranks=ranks,
                         **settings)


def concept_names(site: Site) -> dict[int, str] | None:
    """concept -> its name (`concepts.analysis.names`, from the exemplar index beside the dictionary), or None."""
    return _names(site.source, site.dictionary)


@lru_cache(maxsize=64)   # a process names each dictionary's concepts once (finding the index checks its weights)
def _names(source: str, dictionary) -> dict[int, str] | None:
    from ..concepts.analysis.names import dictionary_names

    try:
        return {name.concept: name.title for name in dictionary_names(source, dictionary)}
    except (ConceptsError, OSError):
        return None
