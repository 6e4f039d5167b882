"""vitviz against its peers on the same weights, in one run, as ratios (they survive a noisy machine).

    .venv/bin/python benchmarks/bench.py                     # everything (2-core CPU: about 20 minutes)
    .venv/bin/python benchmarks/bench.py --only forward cvt  # some items
    .venv/bin/python benchmarks/bench.py --threads 1 --clock cpu   # a shared machine: CPU time of one thread
    .venv/bin/python benchmarks/bench.py --quick             # tiny models, few repeats (the smoke test)
    .venv/bin/python benchmarks/bench.py --device cuda --autocast --batches 1 32   # a GPU (gpu_check.sh)

Items (issue 8): forward (1), cvt (2), traced (3), pipeline (4), request (5), rerender (6),
coldstart (7), memory (8), peak (9); issue 14: attribution (each explanation method against its
reference package); issue 15: evaluate (against its floor of batched forwards), quantus (region
perturbation against Quantus's), explain (batch explain images/s with --formats npy); issue 24: decide
(direct logit attribution against a traced forward; activation patching against its floor of batched
forwards and against forward hooks on timm); issue 23: compare (CKA of every layer pair against the
traced forwards it needs, and against pytorch-cka's hook-based pass); issue 25: clip (CLIP image and
text features against open_clip's, LeGrad-CLIP against legrad_torch's algorithm); issue 29: swin (Swin-T
against timm: forwards, traced forward, rollout to stage 1 against a traced forward, the memory a trace keeps
against its windowed attention); issue 30: cnn (ResNet-50 and ConvNeXt-T against timm, every block's
receptive field against hooks and autograd on timm); issue 31: video (frames per second end to end against
the same frames' batched traced forwards alone); issue 41: concepts (caching activations against the traced
forwards alone, training steps against Overcomplete's loop, the Concepts tab on top of an Explain); issue 50:
looks (a feature picture's step against a traced forward and backward of its crops, one bundled concept's
picture); issue 58: atlas (the class effects against the traced forwards and backwards they need, the
site of across-cifar10 over 500 images against 15 minutes). Every time is
min / median / max over `--repeats` rounds after warm-up; in each round the contenders run once each,
in rotating order, so a slow spell of the machine hits all of them. Ratios are of medians. Contenders are checked to
compute the same logits before they are timed. Checkpoints are random weights in the real Hub layouts (timm's
`config.json` + `model.safetensors`, transformers' `save_pretrained`), written to a temporary folder and loaded
through `vitviz.load`, as the app loads them; no network is used.

This file is the entry point: the options, the areas and the loop over them. An area that fails prints one line
(`<area> FAILED: ...`) and the others still run; the exit status is then 1. Each area is a module of
`benchmarks/areas/` with a `measure(bench, items)` that prints its lines; `timing.py` times contenders and formats
a line's parts, `workbench.py` holds a run's settings and the checkpoints and photos the areas share.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # vitviz and app.py; tests/' reference implementations

from areas import (  # noqa: E402
    atlas,
    attribution,
    circuits,
    clip,
    cnn,
    coldstart,
    compare,
    concepts,
    cvt,
    decide,
    evaluate,
    explain,
    forward,
    looks,
    peak,
    pipeline,
    quantus,
    request,
    swin,
    training,
    video,
)
from timing import CLOCKS, report  # noqa: E402
from workbench import Bench  # noqa: E402

AREAS = (   # (the items it measures, its module), in the order they run
    (("forward", "traced"), forward), (("cvt",), cvt), (("pipeline",), pipeline), (("request", "rerender"), request),
    (("coldstart", "memory"), coldstart), (("peak",), peak), (("attribution",), attribution),
    (("evaluate",), evaluate), (("quantus",), quantus), (("explain",), explain), (("decide",), decide),
    (("compare",), compare), (("clip",), clip), (("swin",), swin), (("cnn",), cnn), (("video",), video),
    (("concepts",), concepts), (("circuits",), circuits), (("looks",), looks), (("training",), training),
    (("atlas",), atlas))
ITEMS = tuple(item for items, _ in AREAS for item in items)


def main(argv=None) -> None:
    """Parse the options, print the run's header line, then each asked-for area's lines."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny models and images, few repeats (a smoke test)")
    p.add_argument("--only", nargs="+", choices=ITEMS, metavar="ITEM", help=f"some of: {' '.join(ITEMS)}")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per measurement (default 7; 2 quick)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--clock", choices=list(CLOCKS), default="wall",
                   help="cpu: time in-process items by this process's CPU time (with --threads 1, a shared "
                        "machine's other jobs then do not count; cold start and HTTP requests stay wall time)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--autocast", action="store_true", help="bf16 autocast around every timed forward (GPU runs)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes of items 1-3 and 9")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no CUDA device")
    if args.clock == "cpu" and args.device == "cuda":
        p.error("--clock cpu cannot see GPU time: use the wall clock on CUDA")
    if args.threads:
        torch.set_num_threads(args.threads)
    items = set(args.only or ITEMS)
    repeats = args.repeats or (2 if args.quick else 7)
    if repeats < 1:
        p.error("--repeats must be at least 1")
    # running or runnable ones only: a training paused for a quiet window (kill -STOP) takes no CPU
    training = subprocess.run(["pgrep", "-r", "R,S,D", "-f", "vitviz.train"], capture_output=True,
                              text=True).stdout.split()
    report(f"vitviz benchmark: torch {torch.__version__}, {args.device}"
           f"{' (' + torch.cuda.get_device_name() + ')' if args.device == 'cuda' else ''}"
           f"{', bf16 autocast' if args.autocast else ''}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
           f"{args.clock} clock, "
           f"repeats {repeats}{', quick (tiny models)' if args.quick else ''}"
           f"{f', {len(training)} training processes running (numbers slowed)' if training else ''}")
    with tempfile.TemporaryDirectory(prefix="vitviz-bench-") as tmp:
        bench = Bench(quick=args.quick, repeats=repeats, tmp=Path(tmp), device=torch.device(args.device),
                      autocast=args.autocast, clock=args.clock, batches=tuple(args.batches))
        asked = [area for measured, area in AREAS if items.intersection(measured)]
        failed = [area for area in asked if not measured_or_said(area, bench, items)]
    if failed:
        sys.exit(f"{len(failed)} area(s) failed: {', '.join(area_name(a) for a in failed)}")


def area_name(area) -> str:
    return area.__name__.rpartition(".")[2]


def measured_or_said(area, bench: Bench, items: set[str]) -> bool:
    """Run one area; if it fails, print one line saying where and why (its traceback to stderr) and go on, so one
    broken area does not take the later ones with it."""
    try:
        area.measure(bench, items)
        return True
    except (Exception, SystemExit) as error:   # SystemExit: timing's refusal to time two that disagree
        frame = traceback.extract_tb(error.__traceback__)[-1]
        report(f"{area_name(area)} FAILED: {type(error).__name__}: {error} "
               f"({Path(frame.filename).name}:{frame.lineno})")
        traceback.print_exc()
        return False


if __name__ == "__main__":
    main()
