"""`vitviz data cifar10`: the data sets vitviz reads, made (`vitviz.data`)."""
from __future__ import annotations

from pathlib import Path

from ..data import CIFAR10_FILE, CIFAR10_VARIABLE, DataError, cached_cifar10, cifar10_file, make_cifar10
from .common import UsageError


def cmd_data_cifar10(args) -> int:
    """cifar10_jpeg.npz from the public download, and whether the lookup finds it where it was written."""
    out = Path(args.out) if args.out else cached_cifar10()
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder: give the file to write, e.g. {out / CIFAR10_FILE}")
    made = make_cifar10(out)
    try:
        found = cifar10_file().resolve() == made.resolve()
    except DataError:   # $VITVIZ_CIFAR10 names another file, and it is not there
        found = False
    where = ("--data cifar10 and the tests find it there" if found
             else f"set {CIFAR10_VARIABLE}={made} for --data cifar10 and the tests to find it")
    print(f"wrote {made} ({made.stat().st_size / 1e6:.0f} MB); {where}")
    return 0


def add_parser(sub) -> None:
    """`data` under the main parser."""
    d = sub.add_parser("data", help="make the data sets vitviz reads")
    data_sets = d.add_subparsers(dest="data_command", required=True)
    cifar_help = ("make cifar10_jpeg.npz (what --data cifar10 and the tests read) from the public CIFAR-10 "
                  "download (about 170 MB; needs a network)")
    cifar = data_sets.add_parser("cifar10", help=cifar_help, description=f"{cifar_help[0].upper()}{cifar_help[1:]}.")
    cifar.add_argument("--out", default=None, help="the file to write (default: cifar10_jpeg.npz in the user's "
                                                   "cache, $XDG_CACHE_HOME/vitviz/ or ~/.cache/vitviz/, where vitviz "
                                                   "looks last)")
    cifar.set_defaults(run=cmd_data_cifar10)
