"""`vitviz compare`: CKA between every layer of two models over a data set (`vitviz.compare`)."""
from __future__ import annotations

from pathlib import Path

from .. import catalog
from ..compare import TOKENS
from ..data import DataError
from .common import DATA_HELP, UsageError, prepare_out


def cmd_compare(args) -> int:
    from ..compare import MIN_BATCH, compare

    prepare_out(Path(args.out))
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    if args.batch_size < MIN_BATCH:
        raise UsageError(f"--batch-size must be at least {MIN_BATCH} (the debiased HSIC needs 4 images a batch)")
    try:
        compare(models=args.models, data=args.data, out=args.out, limit=args.limit, tokens=args.tokens,
                batch_size=args.batch_size, device=args.device, receptive=args.receptive_field)
    except DataError:
        raise
    except ValueError as e:   # too few images, no class token for --tokens cls, more ranks than batches
        raise UsageError(str(e)) from None
    return 0


def add_parser(sub) -> None:
    """`compare` under the main parser."""
    c = sub.add_parser("compare", help="CKA between every layer of two models over a data set (torchrun shards it)")
    c.add_argument("--models", nargs=2, default=list(catalog.BUNDLED_PAIR), metavar=("A", "B"),
                   help="two catalog names, Hub ids or folders")
    c.add_argument("--data", required=True, help=DATA_HELP)
    c.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    c.add_argument("--out", required=True, help="output folder: cka.npz, three heatmaps, summary.json")
    c.add_argument("--tokens", default="mean", choices=TOKENS,
                   help="each block's features: the grid tokens' mean, the class token (CvT: last stage only), "
                        "or every token flattened")
    c.add_argument("--batch-size", type=int, default=64, help="images per batch (at least 4; the unit of sharding)")
    c.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    c.add_argument("--receptive-field", action="store_true",
                   help="also every block's effective receptive field, averaged over the images (receptive-field.npz)")
    c.set_defaults(run=cmd_compare)
