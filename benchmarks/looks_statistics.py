"""Whether feature pictures look like photographs where they should (issue 56): the corner's luma z, the frequency
axes' share of the energy and how alike same-number concepts of two dictionaries are, for the pictures shipped
beside two bundled dictionaries and for pictures drawn now with the shipped settings, against CIFAR-10's test
photos; and the time a picture takes at the shipped budget.

    OMP_NUM_THREADS=1 python benchmarks/looks_statistics.py                  # shipped and natural only, seconds
    OMP_NUM_THREADS=1 python benchmarks/looks_statistics.py --draw 64        # and the first 64 concepts drawn now
    OMP_NUM_THREADS=1 python benchmarks/looks_statistics.py --fire 16        # do 16 concepts' pictures still fire?
    OMP_NUM_THREADS=1 python benchmarks/looks_statistics.py --budget 8       # the objective against the budget

`natural.corner_z` and `natural.axis_share` define the statistics; r is Pearson's over every pixel value of concept
i's pictures of the two dictionaries, averaged over i. Firing (`--fire N`): N concepts spread over each of
`FIRING`'s dictionaries, each picture (shipped, and drawn now) read whole as `looks.alike` reads one, over the
concept's 99th percentile on 500 CIFAR-10 test photos; a picture fires where that is above 1. Budget (`--budget N`):
N concepts of each `FIRING` dictionary drawn at each of `BUDGETS` (steps, crops a step) with the shipped settings
otherwise: the objective's last value against the largest budget's (median over the concepts), how strongly the whole
picture fires, and the seconds a picture takes; the curve the shipped budget was chosen from.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vitviz import hub
from vitviz.concepts import load as load_dictionary
from vitviz.data import open_data
from vitviz.looks import Concept, draw, natural, pictures_of
from vitviz.looks.pictures import SETTINGS

PAIR = ("vit-cifar10-last", "vit-cifar10-middle")   # two unrelated dictionaries of one model
PHOTOS = 2000                                         # CIFAR-10 test photos for the natural statistics
FIRING = ("vit-cifar10-last", "resnet-cifar10-last")
BUDGETS = ((8, 1), (16, 2), (32, 2), (64, 2), (64, 4), (128, 4))   # (steps, crops a step)


def summary(images: np.ndarray) -> str:
    z, share = natural.corner_z(images), natural.axis_share(images)
    return f"corner |z| {np.abs(z).mean():.2f} (mean z {z.mean():+.2f}), axis share {share.mean():.4f}"


def alike(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over i of Pearson's r between a[i] and b[i] (every pixel value)."""
    return float(np.mean([np.corrcoef(x.ravel(), y.ravel())[0, 1] for x, y in zip(a, b)]))


def firing(count: int, photos) -> None:
    """How many of `count` concepts of each `FIRING` dictionary fire on their shipped picture and on one drawn now."""
    from vitviz.looks.alike import read_in

    for name in FIRING:
        model = hub.load(load_dictionary(name).model, device="cpu")
        pictures = pictures_of(name)
        concepts = np.linspace(0, pictures.n_concepts - 1, count).round().astype(int).tolist()
        drawn = draw(model, [Concept(name, c) for c in concepts], settings=SETTINGS, device="cpu", bar=False).images
        ratios = []
        for i, concept in enumerate(concepts):
            shipped = torch.from_numpy(pictures.picture(concept)[0].astype(np.float32) / 255).permute(2, 0, 1)
            now = torch.from_numpy(drawn[i]).permute(2, 0, 1)
            q, values = read_in(model, {}, name, concept, photos, 500, torch.stack([shipped, now]))
            ratios.append(values / q if q > 0 else (np.nan, np.nan))
        ratios = np.array(ratios)
        above = (ratios > 1).sum(0)
        print(f"{name}, concepts {concepts}: above their 99th percentile on the shipped picture {above[0]} of "
              f"{count}, on one drawn now {above[1]} of {count} (median {np.nanmedian(ratios[:, 0]):.2f}x and "
              f"{np.nanmedian(ratios[:, 1]):.2f}x)")


def budget(count: int, photos) -> None:
    """The objective, the firing and the time of `count` concepts' pictures at each of `BUDGETS`."""
    from dataclasses import replace

    from vitviz.looks.alike import read_in

    for name in FIRING:
        model = hub.load(load_dictionary(name).model, device="cpu")
        concepts = np.linspace(0, load_dictionary(name).n_concepts - 1, count).round().astype(int).tolist()
        drawings, seconds = [], []
        for steps, copies in BUDGETS:
            start = time.perf_counter()
            drawings.append(draw(model, [Concept(name, c) for c in concepts], settings=replace(
                SETTINGS, steps=steps, copies=copies), device="cpu", bar=False))
            seconds.append((time.perf_counter() - start) / count)
        ratios = []
        for i, concept in enumerate(concepts):
            pictures = torch.stack([torch.from_numpy(d.images[i]).permute(2, 0, 1) for d in drawings])
            q, values = read_in(model, {}, name, concept, photos, 500, pictures)
            ratios.append(values / q if q > 0 else np.full(len(BUDGETS), np.nan))
        ratios = np.array(ratios)
        last = np.array([d.curve[:, -1] for d in drawings])   # budgets x concepts
        print(f"{name}, concepts {concepts} (steps x crops: objective / the largest budget's, median; the whole "
              f"picture over the 99th percentile, median and how many above 1; seconds a picture, {count} at once):")
        for k, (steps, copies) in enumerate(BUDGETS):
            print(f"  {steps:4d} x {copies}: {np.median(last[k] / last[-1]):.2f}, {np.nanmedian(ratios[:, k]):.2f}x "
                  f"({int((ratios[:, k] > 1).sum())} of {count}), {seconds[k]:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draw", type=int, default=0, help="draw the first N concepts of each dictionary now")
    parser.add_argument("--fire", type=int, default=0, help="whether N concepts' pictures fire (shipped, drawn now)")
    parser.add_argument("--budget", type=int, default=0, help="N concepts drawn at each budget of BUDGETS")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = open_data("cifar10", split="test")
    if args.budget:
        budget(args.budget, data)
        return
    if args.fire:
        firing(args.fire, data)
    photos = np.stack([np.asarray(data.image(i)) for i in range(PHOTOS)])
    natural_share = natural.axis_share(photos).mean()
    print(f"CIFAR-10 test photos ({PHOTOS}): {summary(photos)}")
    shipped = {}
    for name in PAIR:
        pictures = pictures_of(name)
        shipped[name] = np.stack([pictures.picture(i)[0] for i in range(pictures.n_concepts)])
        share = natural.axis_share(shipped[name]).mean()
        print(f"shipped {name} ({pictures.n_concepts} pictures, {pictures.seconds / pictures.n_concepts:.2f} s "
              f"each when drawn): {summary(shipped[name])}, {share / natural_share:.2f}x the photos' axis share")
    n = min(len(v) for v in shipped.values())
    print(f"shipped: concept i of {PAIR[0]} and of {PAIR[1]}, r = {alike(*(v[:n] for v in shipped.values())):.3f}; "
          f"shifted by one, r = {alike(shipped[PAIR[0]][:n - 1], shipped[PAIR[1]][1:n]):.3f}")
    if not args.draw:
        return
    drawn = {}
    for name in PAIR:
        model = hub.load(load_dictionary(name).model, device="cpu")
        start = time.perf_counter()
        drawing = draw(model, [Concept(name, c) for c in range(args.draw)], settings=SETTINGS, device="cpu",
                       bar=False)
        seconds = (time.perf_counter() - start) / args.draw
        drawn[name] = drawing.images
        share = natural.axis_share(drawing.images).mean()
        print(f"drawn now {name} ({args.draw} pictures at once, shipped settings, one thread: {seconds:.2f} s "
              f"each): {summary(drawing.images)}, {share / natural_share:.2f}x the photos' axis share")
    print(f"drawn now: concept i of {PAIR[0]} and of {PAIR[1]}, r = {alike(*drawn.values()):.3f}; shifted by one, "
          f"r = {alike(drawn[PAIR[0]][:-1], drawn[PAIR[1]][1:]):.3f}")


if __name__ == "__main__":
    main()
