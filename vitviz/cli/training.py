"""`vitviz training`: what changes as models learn, at every checkpoint their training runs kept
(`vitviz.training`): training-<model>.json per model and its figures."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from .. import catalog
from ..data import DataError
from ..files import png_bytes, write_atomic
from .common import DATA_HELP, UsageError, prepare_out


def cmd_training(args) -> int:
    from .. import training

    out = prepare_out(Path(args.out))
    if args.limit is not None and args.limit < 4:
        raise UsageError(f"--limit must be at least 4 (CKA to the final model needs 4 images), not {args.limit}")
    try:
        for model in args.models:   # every model's run found before the first is measured
            training.checkpoints(model)
    except ValueError as e:
        raise UsageError(str(e)) from None
    results = []
    for model in args.models:
        bar = tqdm(total=1.0, desc=model, file=sys.stderr, bar_format="{desc} {percentage:3.0f}%|{bar}|")
        try:
            result = training.follow(model, data=args.data, limit=args.limit, batch_size=args.batch_size,
                                     device=args.device, progress=_reporter(bar, model))
        except DataError:
            raise
        except ValueError as e:   # no labels, classes it does not know, too few images
            raise UsageError(str(e)) from None
        finally:
            bar.close()
        results.append(result)
        write_atomic(out / training.file_name(model), (json.dumps(result, indent=2) + "\n").encode())
        for figure, draw in ((training.FIGURE_DISTANCE, training.distance_figure),
                             (training.FIGURE_CKA, training.cka_figure)):
            if figure == training.FIGURE_DISTANCE and result["checkpoints"][-1]["attention_distance"][-1] is None:
                continue   # a convolutional network: no attention, no distance
            write_atomic(out / training.figure_name(model, figure), png_bytes(draw(result)))
    write_atomic(out / training.CURVES_FILE, png_bytes(training.curves_figure(results)))
    for result in results:
        first, last = result["checkpoints"][0], result["checkpoints"][-1]
        print(f"{result['model']}: {len(result['checkpoints'])} checkpoints, step {first['step']} to {last['step']}, "
              f"accuracy {100 * first['accuracy']:.1f} % to {100 * last['accuracy']:.1f} % "
              f"over {result['images']} images")
    print(f"written to {out}")
    return 0


def _reporter(bar: tqdm, model: str):
    """`training.follow`'s progress on a bar: the share done and the checkpoint being measured."""
    def report(fraction: float, words: str) -> None:
        bar.n = fraction
        bar.set_description(f"{model}: {words}")
    return report


def add_parser(sub) -> None:
    """`training` under the main parser."""
    t = sub.add_parser("training", help="what changes as models learn: every kept checkpoint of their training")
    t.add_argument("--models", nargs="+", default=list(catalog.BUNDLED_PAIR), metavar="MODEL",
                   help="bundled models that keep their training's checkpoints, or `vitviz.train --out` folders")
    t.add_argument("--data", default="cifar10", help=DATA_HELP + " (labelled: accuracy needs the labels)")
    t.add_argument("--limit", type=int, default=100, help="images, spread evenly over the data (default 100)")
    t.add_argument("--out", required=True, help="output folder: training-<model>.json and the figures")
    t.add_argument("--batch-size", type=int, default=50, help="images per batch (at least 4, CKA's unit)")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.set_defaults(run=cmd_training)
