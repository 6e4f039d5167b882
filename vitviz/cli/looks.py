"""`vitviz looks`: what a concept, unit, channel or class looks like, drawn by feature visualisation
(`vitviz.looks`): one picture per target (at one grid cell with --position), with its transparency map and the
objective's curve beside it, or --variants N of them pushed apart by the diversity term, and with --negative the
picture that lowers it most; or, with --pictures, every concept of a dictionary, written beside it (the pictures the
app's concept cards show); or, with --alike, whether the models of a dictionary across them see its concepts alike
(`looks.alike`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..files import png_bytes, write_atomic
from .common import UsageError, prepare_out


def _pair(text: str, what: str) -> tuple[int, int]:
    block, sep, index = text.partition(":")
    try:
        return int(block), int(index)
    except ValueError:
        raise UsageError(f"--{what} takes BLOCK:{what.upper()} (two whole numbers, e.g. 3:17), not {text!r}") from None


def targets_of(args) -> list[tuple[str, object]]:
    """(file name stem, target) for every target the command line asks for, in its order; at --position's cell
    (the stem says which)."""
    from ..looks import Channel, Concept, Label, Unit

    at, cell = args.position, "" if args.position is None else f"-cell{args.position}"
    if at is not None and args.label:
        raise UsageError("--position is a grid cell, and a class's logit has no place on the grid: draw --class "
                         "without --position")
    named = [(f"concept-{i:04d}{cell}", Concept(args.concepts, i, position=at)) for i in args.ids or []]
    for text in args.unit or []:
        block, unit = _pair(text, "unit")
        named.append((f"unit-{block}-{unit:04d}{cell}", Unit(block, unit, position=at)))
    for text in args.channel or []:
        block, channel = _pair(text, "channel")
        named.append((f"channel-{block}-{channel:04d}{cell}", Channel(block, channel, position=at)))
    for label in args.label or []:
        named.append((f"class-{label}", Label(int(label) if label.isdigit() else label)))
    return named


def write_picture(out: Path, stem: str, image, alpha, curve, record: dict) -> None:
    """A picture, its transparency map, the two together and its curve (with `record`: how it was drawn)."""
    from ..looks import transparent

    write_atomic(out / f"{stem}.png", png_bytes((image * 255).round().astype("uint8")))
    write_atomic(out / f"{stem}-alpha.png", png_bytes((alpha * 255).round().astype("uint8")))
    write_atomic(out / f"{stem}-transparent.png", png_bytes(transparent(image, alpha)))
    record = {**record, "target": stem, "objective": [round(float(v), 5) for v in curve]}
    write_atomic(out / f"{stem}-curve.json", (json.dumps(record, indent=1) + "\n").encode())


def models_of(args) -> list[str]:
    """The models to draw in: --model, else the dictionary's (all of a dictionary across models: the shared picture)."""
    if args.model:
        return args.model
    if args.concepts is None:
        raise UsageError("say which model to draw in: --model M (a dictionary's concepts need none: --concepts DICT)")
    from ..concepts import Across, ConceptsError, load

    try:
        dictionary = load(args.concepts)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    models = dictionary.models if isinstance(dictionary, Across) else (dictionary.model,)
    if not all(models):
        raise UsageError(f"{args.concepts} does not record its model: say which with --model M")
    return list(models)


def bar_progress(bar):
    """A `progress(done, all)` callback moving a tqdm bar."""
    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
    return progress


def every_concept(args) -> int:
    """--pictures: every concept's pictures drawn and written beside the dictionary; --alike (of a dictionary across
    models): every concept's table of how each model's picture excites it in every model, written into the same file
    (after drawing, with both)."""
    from dataclasses import replace

    from ..concepts.files import folder_of
    from ..looks import pictures_of
    from ..looks.alike import PERCENTILE, tables
    from ..looks.pictures import make_pictures, save_pictures

    folder = folder_of(args.concepts)
    if folder is None:
        raise UsageError(f"{args.concepts} is no dictionary folder here: the pictures are written beside a dictionary")
    if args.pictures:
        with tqdm(desc="pictures", unit="picture", file=sys.stderr) as bar:
            pictures = make_pictures(args.concepts, limit=args.limit, device=args.device or "cpu",
                                     progress=bar_progress(bar), bar=False)
        path = save_pictures(pictures, folder)
        print(f"{pictures.n_concepts} concepts' pictures ({', '.join(pictures.sets)}) drawn in "
              f"{pictures.seconds:.0f} s, written to {path}")
    else:
        pictures = pictures_of(args.concepts)
        if pictures is None:
            raise UsageError(f"{args.concepts} has no pictures yet: draw them first (--pictures, with --alike to "
                             f"measure the table after)")
    if args.alike:
        with tqdm(desc="models read", unit="model", file=sys.stderr) as bar:
            found = tables(args.concepts, pictures, data=args.data, device=args.device or "cpu",
                           progress=bar_progress(bar))
        path = save_pictures(replace(pictures, tables=found), folder)
        own = np.diagonal(found.values[:, [found.sets.index(m) for m in found.models]], axis1=1, axis2=2)
        print(f"How each model's picture of {pictures.n_concepts} concepts excites them in every model, over its "
              f"{PERCENTILE}th percentile on {found.data}, written to {path}; each model's picture in its own model, "
              f"median: " + ", ".join(f"{m} {v:.2f}x" for m, v in zip(found.models, np.nanmedian(own, axis=0))))
    return 0


def cmd_looks(args) -> int:
    from ..looks import LooksError, Maco, Settings, draw
    from ..looks.alike import PERCENTILE

    try:
        if (args.pictures or args.alike) and (args.position is not None or args.variants != 1 or args.negative):
            raise UsageError("--position, --variants and --negative draw pictures of targets, not with --pictures "
                             "or --alike")
        if args.pictures or (args.alike and not args.ids):
            if args.concepts is None or args.ids or args.unit or args.channel or args.label:
                raise UsageError("--pictures draws every concept of a dictionary (and --alike alone measures how its "
                                 "models see each): give --concepts DICT alone")
            return every_concept(args)
        if args.alike:
            if args.concepts is None or args.unit or args.channel or args.label:
                raise UsageError("--alike reads concepts of a dictionary across models: give --concepts DICT "
                                 "[--ids N...]")
            from ..looks import alike
            for concept in args.ids:
                table = alike(args.concepts, concept, data=args.data, device=args.device or "cpu")
                print(f"concept {concept} of {args.concepts}: each model's own picture read in every model, over its "
                      f"{PERCENTILE}th percentile on {table.data}\n{table.table()}\n{table.words()}\n")
            return 0
        if args.out is None:
            raise UsageError("--out DIR is needed: the folder the pictures are written to")
        named = targets_of(args)
        if not named:
            raise UsageError("nothing to draw: give --concepts DICT --ids N..., --unit BLOCK:UNIT, "
                             "--channel BLOCK:CHANNEL or --class NAME")
        if args.ids and args.concepts is None:
            raise UsageError("--ids are concept numbers of a dictionary: give it with --concepts DICT")
        method = args.method
        if args.box is not None:
            if method != "maco" or not 0 < args.box[0] <= args.box[1] <= 1:
                raise UsageError("--box takes MACO's crop sides, two fractions of the canvas's side with 0 < LO <= HI "
                                 f"<= 1 (--method maco), not {' '.join(map(str, args.box))} with --method {method}")
            method = Maco(box=tuple(args.box))
        out = prepare_out(Path(args.out))
        settings = Settings(method=method, steps=args.steps, copies=args.copies, seed=args.seed, canvas=args.canvas)
        models, targets = models_of(args), [target for _, target in named]
        drawings = [draw(models, targets, settings=settings, variants=args.variants, diversity=args.diversity,
                         device=args.device)]
        if args.negative:
            drawings.append(draw(models, targets, settings=settings, negative=True, device=args.device))
    except LooksError as e:
        raise UsageError(str(e)) from None
    for drawing in drawings:
        record = {"models": list(drawing.models), "method": drawing.method, "steps": args.steps, "copies": args.copies,
                  "seed": drawing.seed, "canvas": args.canvas, "box": args.box, "position": args.position}
        n = drawing.variants
        for i, (image, alpha, curve) in enumerate(zip(drawing.images, drawing.alpha, drawing.curve)):
            stem, variant = named[i // n][0], i % n
            if drawing.negative:
                write_picture(out, f"{stem}-negative", image, alpha, curve, {**record, "negative": True})
            elif n > 1:
                write_picture(out, f"{stem}-v{variant}", image, alpha, curve,
                              {**record, "variant": variant, "variants": n, "diversity": args.diversity})
            else:
                write_picture(out, stem, image, alpha, curve, record)
    drawn = sum(len(d.images) for d in drawings)
    print(f"{drawn} picture(s) drawn in {', '.join(drawings[0].models)} with {drawings[0].method} written to {out}")
    if isinstance(settings.method, Maco):
        print(scale_words(settings.method, drawings[0].images.shape[1], models))
    return 0


def scale_words(method, canvas: int, models: list[str]) -> str:
    """At which scale to look at a MACO picture: the crops the models saw each step, against their inputs."""
    from .. import hub

    low, high = (round(side * canvas) for side in method.box)
    inputs = sorted({f"{hub.load(m).transform.crop[0]} px" for m in models})
    whole = low >= 0.8 * canvas
    return (f"Scale: a {canvas} px canvas, seen each step as crops of {low}-{high} px resized to the models' input "
            f"({', '.join(inputs)}): " + ("the whole picture is what excites the target." if whole else
                                         "its crops at that size excite the target, the whole picture at once less "
                                         "so; to draw it to be seen whole, as the app's cards are: --canvas "
                                         f"{inputs[0].split()[0]} --box 0.8 1.0."))


def add_parser(sub) -> None:
    """`looks` under the main parser."""
    from ..looks import METHODS, Settings
    from ..looks.draw import DIVERSITY

    defaults = Settings()
    p = sub.add_parser("looks", help="what a concept, unit, channel or class looks like (feature visualisation)")
    p.add_argument("--model", nargs="+", help="the model(s) to draw in; several: one picture maximising the target "
                                              "in all at once (default: the dictionary's models)")
    p.add_argument("--concepts", help="a dictionary: a bundled name (vit-cifar10-last) or a folder")
    p.add_argument("--ids", nargs="+", type=int, help="concept numbers of --concepts")
    p.add_argument("--unit", nargs="+", help="BLOCK:UNIT, a hidden unit of a block's MLP (Ghiasi et al. 2022)")
    p.add_argument("--channel", nargs="+", help="BLOCK:CHANNEL, a channel of a block's output")
    p.add_argument("--class", dest="label", nargs="+", help="a class, by name or number: its logit")
    p.add_argument("--out", help="the folder the pictures are written to")
    p.add_argument("--method", choices=sorted(METHODS), default="maco")
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--copies", type=int, default=defaults.copies, help="augmented copies of each picture per step")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--canvas", type=int, default=None, help="the canvas's side in px (default: the method's)")
    p.add_argument("--box", nargs=2, type=float, metavar=("LO", "HI"), default=None,
                   help="MACO's crop sides, fractions of the canvas's (default 0.5 0.6; the cards' pictures: --canvas "
                        "32 --box 0.8 1.0, one picture of the concept a picture, as a photo holds it)")
    p.add_argument("--position", type=int, default=None,
                   help="a grid cell (row-major, from 0) to read a concept, unit or channel at (default: the grid's "
                        "mean)")
    p.add_argument("--variants", type=int, default=1,
                   help="N pictures of each target drawn together from N starts, pushed apart by the diversity term "
                        "(Olah et al. 2017): STEM-v0.png ... STEM-v{N-1}.png")
    p.add_argument("--diversity", type=float, default=DIVERSITY,
                   help="with --variants: the diversity term's weight against the objective")
    p.add_argument("--negative", action="store_true",
                   help="also the picture that lowers each target most (the objective minimised): STEM-negative.png")
    p.add_argument("--device", default=None, help="default: the GPU where there is one, else the CPU")
    p.add_argument("--pictures", action="store_true",
                   help="draw every concept of --concepts and write looks.safetensors beside it (the app's pictures)")
    p.add_argument("--limit", type=int, default=None, help="with --pictures: the first N concepts alone")
    p.add_argument("--alike", action="store_true",
                   help="with --concepts ACROSS --ids N...: how strongly each model's own picture excites the concept "
                        "in every model, over that model's 99th percentile on the data's test photos; without --ids: "
                        "every concept's, from its shipped pictures, written into looks.safetensors")
    p.add_argument("--data", default="cifar10", help="with --alike: the photos the percentiles are taken over")
    p.set_defaults(run=cmd_looks)
