"""`vitviz anatomy`: the ViT paper's figure 7 views of one model (mean attention distance, embedding filters,
position embedding similarity), averaged over images."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from .. import explain, hub, render
from ..files import png_bytes, safe_name, write_atomic
from ..image import ImageError, read_image
from ..session import explain_images
from .common import SIZE_HELP, UsageError, expand_paths, prepare_out


def cmd_anatomy(args) -> int:
    out = prepare_out(Path(args.out))
    loaded = hub.load(args.model, device=args.device, size=args.size)
    paths = expand_paths(args.images)[:args.limit]
    images = []
    for path in paths:
        try:
            images.append(read_image(path))
        except ImageError as e:
            print(f"skipped {path}: {e}", file=sys.stderr)
    if not images:
        raise UsageError("no readable images: mean attention distance is averaged over images")
    sums = None
    for run in tqdm(explain_images(images, loaded, batch_size=args.batch_size), desc="anatomy", unit="image",
                    file=sys.stderr):
        distances = [d[0].numpy() for d in explain.mean_attention_distance(run.trace)]
        sums = distances if sums is None else [s + d for s, d in zip(sums, distances)]
    mean = [(s / len(images)).tolist() for s in sums]
    name = safe_name(loaded.name)
    write_atomic(out / f"{name}-attention-distance.json",
                 (json.dumps({"model": loaded.name, "images": len(images), "unit": "model-input px",
                              "per_layer_per_head": mean}, indent=2) + "\n").encode())
    write_atomic(out / f"{name}-attention-distance.png", png_bytes(render.attention_distance_plot({loaded.name: mean})))
    write_atomic(out / f"{name}-filters.png", png_bytes(render.filter_tiles(render.embedding_filters(loaded.model))))
    write_atomic(out / f"{name}-position-similarity.png",
                 png_bytes(render.position_tiles(render.position_embedding(loaded.model))))
    print(f"anatomy of {loaded.name} over {len(images)} image(s) written to {out}")
    return 0


def add_parser(sub) -> None:
    """`anatomy` under the main parser."""
    a = sub.add_parser("anatomy", help="ViT paper figure 7 views of a model, averaged over images")
    a.add_argument("model")
    a.add_argument("--images", nargs="+", required=True, help="image files, folders or globs")
    a.add_argument("--out", required=True)
    a.add_argument("--limit", type=int, default=256, help="use at most this many images")
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--device", default=None)
    a.add_argument("--size", type=int, default=None, help=SIZE_HELP)
    a.set_defaults(run=cmd_anatomy)
