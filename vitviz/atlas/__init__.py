"""The concept atlas: every concept of one or more dictionaries on a page of its own, every class by the concepts
each model builds it with, searchable, as a static site that opens from file:// and from any static host.

    from vitviz.atlas import build_atlas
    from vitviz.data import open_data
    summary = build_atlas(["across-cifar10"], data=open_data("cifar10"), limit=500, out="site")

    python -m vitviz atlas --dictionaries across-cifar10 --data cifar10 --limit 500 --out site

It reads what other commands made and computes little: the dictionaries and their exemplar indexes, pictures,
metrics, match files and class circuits, from their files; where no class circuit gives a class's concepts, it
measures their effects over the class's images itself. The rooms, in the order the work flows:

- `facts.py`: one dictionary's facts, from the files beside it (what is missing said in a sentence);
- `effects.py`: each concept's effect on each class, averaged over the class's images with a 95 % interval;
- `html.py`: what every page shares (escaping, the frame, numbers, maps as pictures);
- `pages.py` (a concept's page and JSON, a dictionary's page), `classes.py` (a class's page), `front.py` (the front
  page and the search's entries);
- `site.py`: `build_atlas`, writing all of it, again only what is missing or changed;
- `static/`: the stylesheet and the search's script.

It imports nothing from `vitviz.ui`: the app only serves the folder (under /atlas, where one is built).
"""
from .site import Summary, build_atlas

__all__ = ["Summary", "build_atlas"]
