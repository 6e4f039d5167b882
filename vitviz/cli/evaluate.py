"""`vitviz evaluate`: how faithful each method's maps are over a data set (`vitviz.evaluate`)."""
from __future__ import annotations

from pathlib import Path

from .. import catalog
from ..explain import METHODS
from .common import DATA_HELP, UsageError, prepare_out


def cmd_evaluate(args) -> int:
    from ..evaluate import Settings, evaluate

    prepare_out(Path(args.out))
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    try:
        settings = Settings(batch_size=args.batch_size, forward_batch=args.forward_batch, steps=args.steps,
                            regions=args.regions)
    except ValueError as e:
        raise UsageError(f"--{e}") from None
    evaluate(models=args.models, methods=args.methods, data=args.data, out=args.out, limit=args.limit,
             resume=args.resume, settings=settings, device=args.device, prompts=args.prompts)
    return 0


def add_parser(sub) -> None:
    """`evaluate` under the main parser."""
    v = sub.add_parser("evaluate", help="how faithful each method's maps are, over a data set (torchrun shards it)")
    v.add_argument("--models", nargs="+", default=list(catalog.BUNDLED_PAIR), help="catalog names, Hub ids or folders")
    v.add_argument("--methods", nargs="+", default=None, choices=list(METHODS), help="default: every method")
    v.add_argument("--data", required=True, help=DATA_HELP)
    v.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    v.add_argument("--out", required=True, help="output folder: records, summary.json, summary.md, plots")
    v.add_argument("--resume", action="store_true", help="skip the images whose records are complete")
    v.add_argument("--batch-size", type=int, default=32, help="images per batch (the unit of sharding)")
    v.add_argument("--forward-batch", type=int, default=None,
                   help="perturbed images per forward (default: 8 on the CPU, 256 on CUDA)")
    v.add_argument("--steps", type=int, default=16, help="deletion/insertion steps")
    v.add_argument("--prompts", default=None, metavar="TEMPLATE",
                   help='CLIP models: the prompt template filled with the data\'s class names, e.g. "a photo of a {}"')
    v.add_argument("--regions", type=int, default=100, help="region perturbation: at most this many token cells")
    v.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    v.set_defaults(run=cmd_evaluate)
