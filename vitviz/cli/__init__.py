"""vitviz's command line: the entry point (`main`, what `vitviz` and `python -m vitviz` run) and the parser,
one module per command group (`explain`, `evaluate`, `compare`, `anatomy`, `video`, `models` with `train`, `training`,
`concepts`, `looks`, `circuits`, `atlas`, `data`), each adding its own subcommands; what they share is `common.py`.

    python -m vitviz explain PATH... --models vit-base cvt-13 --methods rollout grad-rollout chefer --out DIR
    python -m vitviz evaluate --models vit-cifar10 cvt-cifar10 --data DIR|FILE.npz|cifar10 --limit N --out DIR
    python -m vitviz compare --models vit-cifar10 cvt-cifar10 --data DIR|FILE.npz|cifar10 --limit N --out DIR
    python -m vitviz video CLIP.mp4... --models vit-base cvt-13 --methods rollout chefer --fps 8 --out DIR
    python -m vitviz anatomy MODEL --images DIR --out DIR
    python -m vitviz models
    python -m vitviz train --arch vit-cifar --out checkpoints/vit-cifar10
    python -m vitviz training --models vit-cifar10 cvt-cifar10 --data cifar10 --limit 100 --out DIR
    python -m vitviz concepts train --models vit-cifar10 --block -1 --data FILE.npz --kind topk --k 32 --out DIR
    python -m vitviz looks --concepts vit-cifar10-last --ids 394 17 --out DIR
    python -m vitviz circuits PHOTO --models vit-cifar10 cvt-cifar10 --out DIR
    python -m vitviz atlas --dictionaries across-cifar10 --data cifar10 --limit 500 --out DIR
    python -m vitviz data cifar10 [--out FILE.npz]
"""
from __future__ import annotations

import argparse
import sys

from .. import hub
from ..data import DataError
from . import anatomy, atlas, circuits, compare, concepts, data, evaluate, explain, looks, models, training, video
from .common import UsageError

# in the order --help lists them
GROUPS = (explain, evaluate, compare, anatomy, video, models, training, concepts, looks, circuits, atlas, data)


def parser() -> argparse.ArgumentParser:
    """The whole command line: each group's subcommands under one parser."""
    p = argparse.ArgumentParser(prog="python -m vitviz", description="See inside vision transformers.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parser(sub)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        print("error: --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except (UsageError, DataError, hub.LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
