"""Circuits of two (or more) models side by side, as the app's Circuits tab and `vitviz circuits` show them: which
dictionaries each model's circuit reads, which nodes the models share, and where each site's grid lies on the photo
(what a drawing of the graph needs beyond its JSON).

Dictionaries. Each source serves the models it was trained on: a model's own dictionary that one model, a dictionary
across models each of its models (at the block it was trained on in each), a folder of `block<N>` folders each of
its blocks (`load_dictionaries`). A model's sites are its sources in depth order. By default a bundled model reads
`catalog.CIRCUIT_DICTIONARIES` (three depths and the last block), and where a bundled dictionary across exactly the
models asked for is on disk (`across-vit-cvt-cifar10` for the bundled pair) it takes the place of a model's own at
its block: the same concept ids then appear in both graphs.

Shared nodes. A concept node of a dictionary across models means the same direction in every model it serves: the
node ids `b5/c17` in the ViT and `b7/c17` in the CvT are one concept when both sites read the same across source.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import catalog
from ..concepts.kinds.dictionary import ConceptsError, block_words
from ..render.concepts import Region
from . import load_dictionaries


def ready(name: str) -> bool:
    """Whether a bundled dictionary's weights are on disk (the depth dictionaries are trained after the others)."""
    from ..concepts.files.across import MANIFEST
    from ..concepts.files.own import FILE

    folder = catalog.BUNDLED_DICTIONARIES[name].path
    return (folder / FILE).is_file() or (folder / MANIFEST).is_file()


def default_sources(names: Sequence[str]) -> list[str]:
    """The dictionaries the circuits of the models `names` read when none are named: each bundled model's
    `catalog.CIRCUIT_DICTIONARIES` on disk, and the bundled ones across exactly these models. A model without
    them is refused in words."""
    missing = [name for name in names if name not in catalog.CIRCUIT_DICTIONARIES]
    steps = [name for name in missing if name.partition("@")[0] in catalog.CIRCUIT_DICTIONARIES]
    if steps:   # a bundled model along its training: its dictionaries describe the trained model's blocks
        raise ConceptsError(f"{', '.join(steps)}: a checkpoint along {'their' if len(steps) > 1 else 'its'} training, "
                            f"whose blocks compute other things than the trained model's, so the bundled "
                            f"dictionaries (trained on the model as shipped) do not describe them; the Concepts tab's "
                            f"dictionary across a training run reads the last block at every kept step.")
    if missing:
        raise ConceptsError(f"vitviz has no default dictionaries for {', '.join(missing)}: name them "
                            f"(a folder of block<N> folders from `vitviz concepts train --block A B C`, files, Hub "
                            f"ids). The bundled models have them: {', '.join(catalog.CIRCUIT_DICTIONARIES)}.")
    own = [source for name in names for source in catalog.CIRCUIT_DICTIONARIES[name] if ready(source)]
    across = [e.name for e in catalog.BUNDLED_DICTIONARIES.values()
              if len(names) > 1 and sorted(e.models) == sorted(names) and ready(e.name)]
    return own + across


def sources_for(loaded: Sequence, sources: Sequence[str | Path] | None = None) -> list[list[str]]:
    """Per loaded model, the dictionary sources its circuit reads, in depth order (the module docstring): of
    `sources`, those trained on it; None: `default_sources`. Refused in words: a source trained on none of the
    models, two at one block of a model (named ones; by default the one across the models wins), a model left
    without any."""
    from ..concepts.analysis.photo import model_names
    from ..concepts.kinds.across import Across

    default = sources is None
    found = load_dictionaries(default_sources([model.name for model in loaded]) if default else sources)
    chosen: list[dict[int, tuple[str, bool]]] = [{} for _ in loaded]   # per model: block -> (source, across)
    for source, dictionary, _ in found:
        across = isinstance(dictionary, Across)
        parts = dictionary.dictionaries if across else {dictionary.model: dictionary}
        used = False
        for model, blocks in zip(loaded, chosen):
            names = model_names(model)
            # a dictionary that does not record its model is taken for the one model there is
            part = next((d for n, d in parts.items() if n in names or n is None and len(loaded) == 1), None)
            if part is None:
                continue
            if part.block is None:
                raise ConceptsError(f"{source} does not record which block it was trained on, so a circuit cannot "
                                    f"place it in {model.name}.")
            used = True
            held = blocks.get(part.block)
            if held is None or default and across and not held[1]:   # by default the one across the models wins
                blocks[part.block] = (source, across)
            elif not (default and held[1]):
                raise ConceptsError(f"{held[0]} and {source} both read {block_words(part.block)} of {model.name}: "
                                    f"a circuit has one dictionary a block, so name one of them.")
        if not used:
            trained_on = ", ".join(str(n) for n in parts)
            raise ConceptsError(f"{source} was trained on {trained_on}, which is none of the models asked for "
                                f"({', '.join(model.name for model in loaded)}).")
    for model, blocks in zip(loaded, chosen):
        if not blocks:
            raise ConceptsError(f"None of the dictionaries is for {model.name}: name one trained on it.")
    # a negative block counts from the end: after every block counted from the start
    return [[blocks[b][0] for b in sorted(blocks, key=lambda b: (b < 0, b))] for blocks in chosen]


def shared_nodes(graphs: Sequence[Mapping]) -> list[set[str]]:
    """Per graph (`Circuit.to_json()`), the ids of its concept nodes that every graph holds: the same concept of the
    same dictionary across models."""
    def concepts(graph: Mapping) -> dict[tuple[str, int], str]:
        across = {site["block"]: site["dictionary"] for site in graph["sites"] if site["across"]}
        return {(across[node["block"]], node["concept"]): node["id"] for node in graph["nodes"]
                if node["kind"] == "concept" and node["block"] in across}
    held = [concepts(graph) for graph in graphs]
    common = set.intersection(*(set(h) for h in held)) if len(held) > 1 else set()
    return [{h[key] for key in common} for h in held]


def places(trace, transform, image_size: tuple[int, int], graph: Mapping) -> dict[int, tuple[int, Region]]:
    """Block -> (its stage, where the grid of the graph's site at that block lies on a photo of `image_size` (h, w)
    in fractions (y0, x0, y1, x1)): the model's tokens' tiles (`align.grid_region`), which the cells of a dictionary
    across models cut too. What `render.circuits.circuit_graph` draws each site's nodes with."""
    from ..concepts.activations.align import grid_region

    return {site["block"]: (trace.blocks[site["block"]].stage,
                            grid_region(trace, site["block"], transform, image_size)) for site in graph["sites"]}
