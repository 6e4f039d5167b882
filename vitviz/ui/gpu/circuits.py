"""The Circuits tab's GPU work: each model's circuit of concepts on the photo (`circuits.photo_circuit`, through
its dictionaries at several depths: `circuits.pair.sources_for`), and what the tab's node cards show of each concept
node: its top images from its dictionary's exemplar index, how often it fires there, and what removing it from its
block does to the prediction (`splice.concept_effects`, the Concepts tab's removal). Plain data (`CircuitReading`):
the graph is the `Circuit` dataclass of floats and lists, with what it was pruned from (`Circuit.adjacency`, numpy
arrays), which the tab's size slider prunes again in the app's process."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import gradio as gr
import torch
from PIL import Image

from ...circuits.graph import FAITHFUL
from ...gate import MODEL_GATE
from ...session import ModelRun
from .boundary import gpu, loading_seconds, models_of
from .dictionaries import ConceptImage, Removal, exemplar_images

if TYPE_CHECKING:   # vitviz.circuits and vitviz.concepts are imported where they are used (scipy: the server's start)
    from ...circuits import Circuit
    from ...concepts.analysis.exemplars import Exemplars

# per model: a forward and a backward, a batched forward for the edges between each pair of sites, one for the
# faithfulness curve and one for the check against patching (integrated gradients: `steps` backward passes a site),
# and the removal of the kept concepts (one forward a site)
CIRCUIT_S, IG_S = 30, 60


@dataclass(frozen=True)
class CircuitReading:
    """One model's circuit as it crosses back: the graph, the dictionaries it read (in depth order), and for its
    concept nodes (by id) their top images and how often each fires over its index's data set (`data`, by block);
    where a site has no index, why (`index_words`); per block what removing each kept concept does to the target's
    probability (a `Removal`), or why it cannot be removed, in words."""
    circuit: Circuit
    sources: list[str]
    exemplars: dict[str, list[ConceptImage]] = field(default_factory=dict)
    frequency: dict[str, float] = field(default_factory=dict)
    data: dict[int, str] = field(default_factory=dict)
    index_words: dict[int, str] = field(default_factory=dict)
    removal: dict[int, Removal | str] = field(default_factory=dict)


@lru_cache(maxsize=32)   # a process reads each site's index once (its checksum against the weights costs a pass)
def site_index(source: str, model: str) -> tuple[Exemplars | None, str]:
    """The exemplar index of dictionary `source` (the part of `model`, for one across models) in its folder, or None
    and why not, in words."""
    from ...concepts import ConceptsError, load
    from ...concepts.analysis.exemplars import index_in
    from ...concepts.files import folder_of
    from ...concepts.kinds.across import Across

    folder = folder_of(source)
    if folder is None:
        return None, f"{source} comes from the Hub, where vitviz finds no exemplar index."
    try:
        dictionary = load(source)
        return index_in(folder, dictionary=dictionary.dictionaries[model] if isinstance(dictionary, Across)
                        else dictionary), ""
    except ConceptsError as e:
        return None, str(e)


def removals(run: ModelRun, circuit: Circuit) -> dict[int, Removal | str]:
    """Per own site, the target's probability with each of its kept concepts removed from the block's output (one
    forward of C + 1 rows, `splice.concept_effects`); across models, or where the block cannot be spliced, why not."""
    from ...circuits import load_dictionaries
    from ...concepts import ConceptsError
    from ...concepts.analysis.photo import ACROSS_REMOVAL
    from ...concepts.analysis.splice import concept_effects

    found: dict[int, Removal | str] = {}
    for site in circuit.sites:
        kept = [n.concept for n in circuit.nodes if n.kind == "concept" and n.block == site["block"]]
        if site["across"]:
            found[site["block"]] = ACROSS_REMOVAL
            continue
        if not kept:
            continue
        try:
            (_, dictionary, _), = load_dictionaries([site["dictionary"]])   # read once a process
            effects = concept_effects(run.loaded, run.trace, dictionary, concepts=kept, target=circuit.target,
                                      block=site["block"])
        except ConceptsError as e:
            found[site["block"]] = str(e)
            continue
        found[site["block"]] = Removal(
            target=run.label(effects.target), probability=effects.probability,
            without={c: (float(p), run.label(int(top))) for c, p, top in
                     zip(kept, effects.probabilities.tolist(), effects.predictions.tolist())})
    return found


def reading(run: ModelRun, circuit: Circuit, sources: list[str]) -> CircuitReading:
    """What the cards show of `circuit`'s concept nodes, read on `run` (the model traced on the photo)."""
    found = CircuitReading(circuit=circuit, sources=sources, removal=removals(run, circuit))
    for site in circuit.sites:
        index, words = site_index(site["dictionary"], run.loaded.name)
        if index is None:
            found.index_words[site["block"]] = words
            continue
        found.data[site["block"]] = index.data
        for node in circuit.nodes:
            if node.kind == "concept" and node.block == site["block"]:
                found.exemplars[node.id] = exemplar_images(index, node.concept, run, site["block"])
                found.frequency[node.id] = float(index.frequency[node.concept])
    return found


def circuit_seconds(names, picture, target, contrast=None, *, method: str = "atp", **settings) -> int:
    """A pair's circuits' GPU time: integrated gradients take `steps` backward passes a site; loading a model."""
    return (IG_S if method == "ig" else CIRCUIT_S) + loading_seconds(names)


@gpu(duration=circuit_seconds)
def read_circuits(names: list[str], picture: Image.Image, target: str | None, contrast: str | None = None, *,
                  baseline: str = "zero", method: str = "atp", frozen: bool = False, faithful: float = FAITHFUL,
                  progress=None) -> list[CircuitReading | str]:
    """Each model's circuit of class `target` (None: each model's own top class; minus `contrast`, or else minus the
    mean logit; class names: every model's own index) on the
    photo `picture`, through its default dictionaries (`pair.sources_for`: three depths and the last block, the
    bundled pair's dictionary across both in place of its own at its block): per model a `CircuitReading`, or why
    it has none, in words. `progress(fraction, description)` hears each model start."""
    from ...circuits import photo_circuit
    from ...circuits.pair import sources_for
    from ...concepts import ConceptsError

    loaded = models_of(names)
    try:
        sources = sources_for(loaded)
    except ConceptsError:   # a model without dictionaries: the others still get theirs, each alone
        sources = []
        for model in loaded:
            try:
                sources.append(sources_for([model])[0])
            except ConceptsError as e:
                sources.append(str(e))
    found: list[CircuitReading | str] = []
    for k, (model, chosen) in enumerate(zip(loaded, sources)):
        if progress is not None:
            progress(k / len(loaded), desc=f"{model.name}'s circuit")
        if isinstance(chosen, str):
            found.append(chosen)
            continue
        labels = list(model.labels or ())
        missing = [name for name in (target, contrast) if name is not None and name not in labels]
        if missing:
            found.append(f"{model.name} has no class {missing[0]!r}" + (f" (its classes: {', '.join(labels[:12])}"
                         f"{', ...' if len(labels) > 12 else ''})." if labels else ": it has no classifier."))
            continue
        try:
            with MODEL_GATE():
                circuit = photo_circuit(model, picture, dictionaries=chosen,
                                        target=None if target is None else labels.index(target),
                                        contrast=None if contrast is None else labels.index(contrast),
                                        baseline=baseline, method=method, frozen=frozen, faithful=faithful)
                pixels = model.preprocess(picture).to(model.device)
                with torch.inference_mode():
                    run = ModelRun(model, picture, pixels=pixels, trace=model.model.trace(pixels, attention=False))
                found.append(reading(run, circuit, chosen))
        except ConceptsError as e:
            found.append(str(e))
        except ValueError as e:   # a request the model cannot answer
            raise gr.Error(str(e)) from None
    return found


def cell_seconds(names, picture, targets, contrasts, places, *, method: str = "atp", **settings) -> int:
    """A pair's circuits of one place: as `circuit_seconds`."""
    return circuit_seconds(names, picture, None, method=method)


@gpu(duration=cell_seconds)
def read_cell_circuits(names: list[str], picture: Image.Image, targets: list[int | None],
                       contrasts: list[int | None], places: list[list[int | None] | None], *,
                       sources: list[list[str] | None], baseline: str = "zero", method: str = "atp",
                       frozen: bool = False, faithful: float = FAITHFUL) -> list[Circuit | str | None]:
    """Each model's circuit of one place on the photo (`circuits.position_circuit` with `place`: per site the row
    under the click) for the class `targets[k]` (minus `contrasts[k]`, or else minus the mean logit) through the
    dictionaries `sources[k]` its circuit read; None where a model has no circuit (`places[k]` None), or why not in
    words."""
    from ...circuits import photo_circuit
    from ...concepts import ConceptsError

    found: list[Circuit | str | None] = []
    for model, target, contrast, place, chosen in zip(models_of(names), targets, contrasts, places, sources):
        if place is None or chosen is None:
            found.append(None)
            continue
        try:
            with MODEL_GATE():
                found.append(photo_circuit(model, picture, dictionaries=chosen, target=target, contrast=contrast,
                                           baseline=baseline, method=method, frozen=frozen, faithful=faithful,
                                           positions=True, place=place))
        except ConceptsError as e:
            found.append(str(e))
    return found
