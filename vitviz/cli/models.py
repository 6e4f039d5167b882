"""`vitviz models` (the catalog and what is cached) and `vitviz train` (a bundled checkpoint, `vitviz.train`)."""
from __future__ import annotations

import argparse

from .. import catalog, hub
from ..bundle import saved_steps


def cmd_models(args) -> int:
    cached = hub.cached_models()
    print(f"{'name':<22} {'source':<48} {'cached':>10}")
    for name, entry in catalog.CATALOG.items():
        size = cached.get(name)
        status = "bundled" if entry.bundled else (f"{size / 1e6:.0f} MB" if size else "-")
        print(f"{name:<22} {entry.source:<48} {status:>10}")
        steps = saved_steps(entry.path) if entry.bundled else []
        if steps:   # its training run's checkpoints: name@step
            print(f"{'':<22} along its training: {', '.join(f'{name}@{step}' for step in steps)}")
    return 0


def cmd_train(args) -> int:
    from ..train import main as train_main
    train_main(args.rest)
    return 0


def add_parser(sub) -> None:
    """`models` and `train` under the main parser."""
    m = sub.add_parser("models", help="the catalog, what is cached and its size")
    m.set_defaults(run=cmd_models)
    t = sub.add_parser("train", help="train a bundled checkpoint (see python -m vitviz.train --help)",
                       add_help=False)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    t.set_defaults(run=cmd_train)
