"""`vitviz atlas`: the concept atlas, a static site of every concept and class of some dictionaries
(`vitviz.atlas`).

    python -m vitviz atlas --dictionaries across-cifar10 --data cifar10 --limit 500 --out site

Building into a folder that holds an atlas adds what is missing; what cannot be built (a dictionary without an
exemplar index, data without labels) is said in a sentence, and its pages are left out."""
from __future__ import annotations

import sys
from pathlib import Path

from .common import DATA_HELP, UsageError, prepare_out


def cmd_atlas(args) -> int:
    from ..atlas import build_atlas
    from ..atlas.pages import APP
    from ..concepts import ConceptsError
    from ..data import open_data

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    circuits = None
    if args.circuits is not None:
        if not args.circuits.is_dir():
            raise UsageError(f"--circuits {args.circuits} is not a folder (give the folder of class-circuit-*.json "
                             f"files `vitviz circuits --data --class` wrote)")
        circuits = sorted(args.circuits.glob("class-circuit-*.json"))
    data = open_data(args.data, split=args.split) if args.data else None
    out = prepare_out(args.out)
    try:
        summary = build_atlas(args.dictionaries, out=out, data=data, limit=args.limit, circuits=circuits,
                              app=args.app or APP)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    for note in summary.notes:
        print(f"note: {note}", file=sys.stderr)
    measured = f"; effects measured: {'; '.join(summary.measured)}" if summary.measured else ""
    print(f"{out}: {summary.concepts} concept pages and {summary.classes} class pages ({summary.written} files "
          f"written, {summary.kept} kept) in {summary.seconds:.1f} s{measured}. Open {out / 'index.html'}.")
    return 0


def add_parser(sub) -> None:
    """`atlas` under the main parser."""
    p = sub.add_parser("atlas", help="the concept atlas: a static site of every concept and class of dictionaries")
    p.add_argument("--dictionaries", nargs="+", required=True,
                   help="bundled names (across-cifar10, vit-cifar10-last, ...) or dictionaries' folders")
    p.add_argument("--data", help=f"labelled images the class pages are measured over: {DATA_HELP}")
    p.add_argument("--split", default="test", help="the split of an .npz (default: test)")
    p.add_argument("--limit", type=int, default=None, help="images of --data, spread over it (default: all)")
    p.add_argument("--circuits", type=Path, default=None,
                   help="a folder of class circuits (default: the bundled pair's, checkpoints/circuits/)")
    p.add_argument("--app", default=None, help="the app's address a concept's page links to (default: the app "
                                              "serving the atlas under /atlas)")
    p.add_argument("--out", type=Path, required=True, help="the site's folder")
    p.set_defaults(run=cmd_atlas)
