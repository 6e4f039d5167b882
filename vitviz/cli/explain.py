"""`vitviz explain`: images through the models, every map, view and array into a folder with its manifest (the
pipeline is `vitviz.export.export_images`)."""
from __future__ import annotations

import sys
from pathlib import Path

from .. import explain, hub
from ..distributed import ranks as process_ranks
from ..explain import METHODS
from ..export import FORMATS, MANIFEST, export_images
from .common import SIZE_HELP, UsageError, expand_paths, prepare_out


def cmd_explain(args) -> int:
    """The images through the models, their files and manifest in --out (`export.export_images`, sharded by image
    under torchrun); the skipped images and what was written, said."""
    out = prepare_out(Path(args.out))
    paths = expand_paths(args.paths)
    with process_ranks(args.device) as ranks:
        models = [hub.load(name, device=ranks.device, size=args.size) for name in args.models]
        concept_readers = dictionaries_for(models, args.concepts) if args.concepts else None
        written = export_images(paths, models, out, ranks=ranks, methods=args.methods, formats=args.formats,
                                head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
                                batch_size=args.batch_size, faithfulness_steps=args.faithfulness_steps,
                                decide=args.decide, concepts=concept_readers, resume=args.resume)
    if written is None:   # a rank other than 0: rank 0 reports
        return 0
    entries, skipped = written
    for s in skipped:
        print(f"skipped {s['path']}: {s['reason']}", file=sys.stderr)
    print(f"wrote {len(entries)} image(s) to {out} ({len(skipped)} skipped); manifest: {out / MANIFEST}")
    return 0


def dictionaries_for(models: list, sources: list[str]) -> list:
    """Each model's dictionary among `sources` (`concepts.analysis.photo.readers`), refused as a usage error in
    words."""
    from ..concepts import ConceptsError
    from ..concepts.analysis.photo import readers

    try:
        return readers(models, sources)
    except ConceptsError as e:
        raise UsageError(f"--concepts: {e}") from None


def add_parser(sub) -> None:
    """`explain` under the main parser."""
    e = sub.add_parser("explain", help="explain images: maps, overlays, views and a manifest")
    e.add_argument("paths", nargs="+", help="image files, folders or globs")
    e.add_argument("--models", nargs="+", default=["vit-cifar10", "cvt-cifar10"],
                   help="catalog names, Hub ids or folders")
    e.add_argument("--methods", nargs="+", default=["rollout"], choices=list(METHODS))
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument("--batch-size", type=int, default=8)
    e.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    e.add_argument("--size", type=int, default=None, help=SIZE_HELP)
    e.add_argument("--resume", action="store_true", help="skip images whose outputs are complete")
    e.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS,
                   help="what to write per map: png (the overlay and every view) and/or npy (the array)")
    e.add_argument("--head-fusion", default="mean", choices=explain.HEAD_FUSIONS)
    e.add_argument("--discard-ratio", type=float, default=0.0)
    e.add_argument("--faithfulness-steps", type=int, default=8, help="deletion/insertion steps (0: skip)")
    e.add_argument("--decide", action="store_true",
                   help="also write decide.json (the top class's logit split over embedding, heads, attention biases "
                        "and MLPs: direct logit attribution) and each head's token-effect maps as .npy")
    e.add_argument("--concepts", nargs="+", default=None, metavar="DICTIONARY",
                   help="concept dictionaries (folders, files, Hub ids or catalog names; one per model, or one across "
                        "models): each photo's codes go to concepts.npy and its most active concepts to the manifest")
    e.set_defaults(run=cmd_explain)
