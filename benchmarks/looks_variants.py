"""Variants and the negative (issue 56, item 4): N pictures of each of a bundled dictionary's concepts drawn together
from different starts with the diversity term (Olah et al. 2017), at each of a few weights, and the picture that
lowers each concept most, all at the shipped pictures' settings (`pictures.SETTINGS`, what a card draws).

    OMP_NUM_THREADS=1 python benchmarks/looks_variants.py                          # 16 concepts, weights 0 and 1
    OMP_NUM_THREADS=1 python benchmarks/looks_variants.py --weights 0 0.5 1 2 4 --concepts 8
    OMP_NUM_THREADS=1 python benchmarks/looks_variants.py --read looks/ --concept 17   # what `vitviz looks` wrote

For each weight: the variants' pairwise Pearson r over pixel values (each concept's N variants, every pair), the
cosine between their Gram matrices at the concept's block (what the term lowers; the whole picture read once), each
variant's value over the concept's 99th percentile on 500 CIFAR-10 test photos (the whole picture read as
`looks.alike` reads one: above 1 it excites the concept as the top 1 % of photos do), and the seconds; then the
ordinary picture's and the negative's value over the same percentile. With --read, the same for the variants and
negative `vitviz looks --variants N --negative` wrote of one concept (`concept-CCCC-v*.png`, `-negative.png`).
"""
from __future__ import annotations

import argparse
import time
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitviz import hub
from vitviz.concepts import load as load_dictionary
from vitviz.data import open_data
from vitviz.looks import Concept, draw
from vitviz.looks.alike import IMAGES, PERCENTILE, read_in
from vitviz.looks.draw import DIVERSITY, gram_cosines
from vitviz.looks.pictures import SETTINGS
from vitviz.looks.targets import Readout


def timed(model, targets, **options):
    began = time.perf_counter()
    drawing = draw(model, targets, settings=SETTINGS, device="cpu", bar=False, **options)
    return drawing, time.perf_counter() - began


def gram_alike(model, block: int, images: np.ndarray) -> list[float]:
    """The Gram cosines of every pair of `images` (N S S 3, read whole) at `block`."""
    pixels = torch.nn.functional.interpolate(torch.from_numpy(images).permute(0, 3, 1, 2),
                                             size=tuple(model.transform.crop), mode="bilinear", antialias=True)
    with torch.no_grad():
        tokens = model.model.trace(model.transform.normalize(pixels), attention=False).blocks[block]
        cosines = gram_cosines(tokens.tokens[:, tokens.prefix:], variants=len(images), copies=1)[0]
    return [float(cosines[i, j]) for i, j in combinations(range(len(images)), 2)]


def read_written(folder: Path, name: str, concept: int) -> None:
    """Pairwise r of the variants the command wrote of `concept`, and each one's (and the negative's) value over the
    concept's 99th percentile."""
    stems = sorted(p.stem for p in folder.glob(f"concept-{concept:04d}-v*.png") if p.stem[-1].isdigit())
    stems += [f"concept-{concept:04d}-negative"] if (folder / f"concept-{concept:04d}-negative.png").exists() else []
    images = np.stack([np.asarray(Image.open(folder / f"{stem}.png"), dtype=np.float32) / 255 for stem in stems])
    variants = [i for i, stem in enumerate(stems) if not stem.endswith("negative")]
    r = [np.corrcoef(images[i].ravel(), images[j].ravel())[0, 1] for i, j in combinations(variants, 2)]
    model = hub.load(load_dictionary(name).model, device="cpu")
    q, values = read_in(model, {}, name, concept, open_data("cifar10", split="test"), IMAGES,
                        torch.from_numpy(images).permute(0, 3, 1, 2))
    print(f"{name} concept {concept} in {folder}: pairwise r of the variants {', '.join(f'{x:.2f}' for x in r)}; "
          f"over its {PERCENTILE}th percentile on {IMAGES} CIFAR-10 test photos ({q:.2f}): "
          + ", ".join(f"{stem} {v / q:.2f}x" for stem, v in zip(stems, values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dictionary", default="vit-cifar10-last")
    parser.add_argument("--concepts", type=int, default=16, help="concepts spread over the dictionary")
    parser.add_argument("--variants", type=int, default=3)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, DIVERSITY])
    parser.add_argument("--read", type=Path, default=None, help="a folder `vitviz looks --variants` wrote into")
    parser.add_argument("--concept", type=int, default=17, help="with --read: the concept it drew")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.read is not None:
        read_written(args.read, args.dictionary, args.concept)
        return
    name, n = args.dictionary, args.variants
    dictionary = load_dictionary(name)
    model = hub.load(dictionary.model, device="cpu")
    concepts = np.linspace(0, dictionary.n_concepts - 1, args.concepts).round().astype(int).tolist()
    targets = [Concept(name, c) for c in concepts]
    block = Readout(model, targets[:1]).blocks[0]
    photos = open_data("cifar10", split="test")
    drawn = {w: timed(model, targets, variants=n, diversity=w) for w in args.weights}
    (ordinary, ordinary_s), (negative, negative_s) = timed(model, targets), timed(model, targets, negative=True)
    pairs = list(combinations(range(n), 2))
    print(f"{name}, {len(concepts)} concepts ({concepts[0]} to {concepts[-1]}), {n} variants each, "
          f"{SETTINGS.steps} steps of {SETTINGS.copies} crops; ratios over each concept's {PERCENTILE}th percentile "
          f"on {IMAGES} CIFAR-10 test photos")
    dictionaries, ratios = {}, {w: [] for w in args.weights}
    single = []
    for i, concept in enumerate(concepts):
        pictures = np.concatenate([*(drawn[w][0].images[i * n:(i + 1) * n] for w in args.weights),
                                   ordinary.images[i:i + 1], negative.images[i:i + 1]])
        q, values = read_in(model, dictionaries, name, concept, photos, IMAGES,
                            torch.from_numpy(pictures).permute(0, 3, 1, 2))
        for k, w in enumerate(args.weights):
            ratios[w].append(values[k * n:(k + 1) * n] / q)
        single.append(values[-2:] / q)
    for w in args.weights:
        drawing, seconds = drawn[w]
        images = drawing.images.reshape(len(concepts), n, *drawing.images.shape[1:])
        r = np.array([[np.corrcoef(v[a].ravel(), v[b].ravel())[0, 1] for a, b in pairs] for v in images])
        grams = np.array([gram_alike(model, block, v) for v in images])
        fire = np.array(ratios[w])
        rise = drawing.curve[:, -1] - drawing.curve[:, 0]
        print(f"diversity {w:g}: pairwise r mean {r.mean():.2f}, max {r.max():.2f} ({(r >= 0.5).sum()} of {r.size} "
              f"pairs at 0.5 or more); Gram cosine mean {grams.mean():.3f}; variants above the percentile "
              f"{(fire > 1).sum()} of {fire.size} (median {np.median(fire):.2f}x, least {fire.min():.2f}x); "
              f"concepts with every pair r < 0.5 and every variant above: "
              f"{((r < 0.5).all(1) & (fire > 1).all(1)).sum()} of {len(concepts)}; objective rose in "
              f"{(rise > 0).sum()} of {rise.size} (median {np.median(rise):.2f}); {seconds:.0f} s "
              f"({seconds / len(drawing.images):.2f} s a picture)")
    single = np.array(single)
    print(f"ordinary picture: median {np.median(single[:, 0]):.2f}x, above the percentile {(single[:, 0] > 1).sum()} "
          f"of {len(concepts)}, {ordinary_s:.0f} s; negative: median {np.median(single[:, 1]):.2f}x, highest "
          f"{single[:, 1].max():.2f}x, below the ordinary picture in {(single[:, 1] < single[:, 0]).sum()} of "
          f"{len(concepts)}, its objective below its start in {(negative.curve[:, -1] < negative.curve[:, 0]).sum()} "
          f"of {len(concepts)}, {negative_s:.0f} s")


if __name__ == "__main__":
    main()
