"""`vitviz video`: videos through one or two models frame by frame (`vitviz.video`)."""
from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from .. import catalog, hub
from ..explain import METHODS
from ..export import image_ids
from .common import SIZE_HELP, UsageError, prepare_out


def cmd_video(args) -> int:
    """Each video through the models frame by frame: OUT/<clip>/side-by-side.mp4 and the rest (`vitviz.video`)."""
    from ..video import VideoError, explain_video

    out = prepare_out(Path(args.out))
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UsageError(f"no video file at {', '.join(missing)}")
    models = [hub.load(name, device=args.device, size=args.size) for name in args.models]
    names = image_ids(paths)
    failed = 0
    for path, name in zip(paths, names):
        bar = tqdm(unit="frame", desc=name, file=sys.stderr)

        def progress(done, total, bar=bar):
            bar.total = total
            bar.update(done - bar.n)
        try:
            result = explain_video(path, models, methods=args.methods, out=out / name, fps=args.fps,
                                   smoothing=args.smoothing, batch_size=args.batch_size, progress=progress)
        except VideoError as e:   # one bad video does not stop the others
            print(f"error: {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        finally:
            bar.close()
        steady = result.stability["consecutive_frames_spearman"]
        words = "; ".join(f"{model}: {method} {value:.2f}" for model, by in steady.items()
                          for method, value in by.items() if value is not None)
        print(f"{path} -> {result.video} ({result.manifest['sampling']['frames']} frames; frame-to-frame rank "
              f"correlation {words})")
        for note in result.fallbacks():   # a CNN drew Grad-CAM in place of a method that reads attention
            print(f"  {note}")
    return 1 if failed else 0


def add_parser(sub) -> None:
    """`video` under the main parser."""
    w = sub.add_parser("video", help="videos through two models frame by frame: one side-by-side MP4, arrays, "
                                     "predictions, a timeline and how steady each explanation is")
    w.add_argument("paths", nargs="+", help="video files (MP4, WebM, MOV, MKV, AVI, animated GIF)")
    w.add_argument("--models", nargs="+", default=list(catalog.BUNDLED_PAIR), help="one or two: catalog names, Hub "
                                                                                 "ids or folders")
    w.add_argument("--methods", nargs="+", default=["rollout"], choices=list(METHODS),
                   help="the maps to compute per frame; the video draws the first (a CNN: Grad-CAM where the "
                        "first reads attention)")
    w.add_argument("--fps", type=float, default=8.0, help="frames sampled per second (the source rate when lower)")
    w.add_argument("--smoothing", type=float, default=0.0,
                   help="exponential moving average weight of the previous frame's map, in [0, 1) (0: off)")
    w.add_argument("--out", required=True, help="output folder: OUT/<video name>/...")
    w.add_argument("--batch-size", type=int, default=8, help="frames per batched forward")
    w.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    w.add_argument("--size", type=int, default=None, help=SIZE_HELP)
    w.set_defaults(run=cmd_video)
