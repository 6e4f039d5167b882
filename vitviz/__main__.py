"""vitviz's command line.

    python -m vitviz explain PATH... --models vit-base cvt-13 --methods rollout grad-rollout chefer --out DIR
    python -m vitviz anatomy MODEL --images DIR --out DIR
    python -m vitviz models
    python -m vitviz train --arch vit-cifar --out checkpoints/vit-cifar10
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from . import catalog, explain, hub, render
from .export import image_files, manifest, png_bytes, safe_name, write_atomic, write_manifest, MANIFEST
from .image import ImageError, read_image
from .session import METHODS, decode_side, explain_images

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".avif"}


class UsageError(Exception):
    """A problem with the command line, said in words the user can act on."""


def expand_paths(patterns: list[str]) -> list[Path]:
    """Files, folders (their image files, sorted) and globs -> image paths, each once, in order."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = [Path(p) for p in sorted(glob.glob(pattern))] if glob.has_magic(pattern) else [Path(pattern)]
        if not matches:
            raise UsageError(f"no file matches {pattern!r}")
        for path in matches:
            if path.is_dir():
                paths += sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            elif path.exists():
                paths.append(path)
            else:
                raise UsageError(f"{path} does not exist")
    return list(dict.fromkeys(paths))


def prepare_out(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".vitviz-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to --out {out}: {e.strerror or e}") from None
    return out


def image_ids(paths: list[Path]) -> list[str]:
    """One folder name per image: its file stem, made unique."""
    ids, seen = [], {}
    for path in paths:
        base = safe_name(path.stem)
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


def complete(out: Path, entry: dict | None, models: list[str], methods: list[str]) -> bool:
    """Whether a previous run's manifest entry already holds every requested output, on disk."""
    if not entry:
        return False
    done = {m["model"]: m for m in entry.get("models", [])}
    for name in models:
        model = done.get(name)
        if model is None or set(methods) - set(model.get("maps", {})):
            return False
        folder = out / entry["id"] / safe_name(name)
        if not all((folder / f).is_file() for f in model.get("files", [])):
            return False
    return True


def cmd_explain(args) -> int:
    out = prepare_out(Path(args.out))
    paths = expand_paths(args.paths)
    methods = list(dict.fromkeys(args.methods))
    params = {"head_fusion": args.head_fusion, "discard_ratio": args.discard_ratio}
    models = [hub.load(name, device=args.device) for name in args.models]
    names = [m.name for m in models]
    previous = json.loads((out / MANIFEST).read_text()) if args.resume and (out / MANIFEST).is_file() else {}
    done = {e["path"]: e for e in previous.get("images", [])}
    entries, skipped, todo = [], [], []
    for path, image_id in zip(paths, image_ids(paths)):
        entry = done.get(str(path))
        if args.resume and complete(out, entry, names, methods):
            entries.append(entry)
        else:
            todo.append((path, image_id))
    if args.resume:
        print(f"resume: {len(entries)} image(s) already complete, {len(todo)} to do", file=sys.stderr)

    def save_manifest():
        write_manifest(out, manifest(models=models, methods=methods, params=params, images=entries,
                                     skipped=skipped, faithfulness_steps=args.faithfulness_steps))

    target = decode_side(models)
    bar = tqdm(total=len(todo), unit="image", desc="explain", file=sys.stderr)
    start = time.time()
    for i in range(0, len(todo), args.batch_size):
        chunk = []
        for path, image_id in todo[i:i + args.batch_size]:
            try:
                chunk.append((path, image_id, read_image(path, target_size=target)))
            except ImageError as e:
                skipped.append({"path": str(path), "reason": str(e)})
                bar.update(1)
        if not chunk:
            continue
        images = [image for _, _, image in chunk]
        runs_per_model = [explain_images(images, loaded, batch_size=args.batch_size) for loaded in models]
        for k, (path, image_id, image) in enumerate(chunk):
            entry = {"id": image_id, "path": str(path), "size": [image.height, image.width], "models": []}
            for runs in runs_per_model:
                files, model_entry = image_files(runs[k], methods, faithfulness_steps=args.faithfulness_steps, **params)
                folder = out / image_id / safe_name(runs[k].name)
                for name, data in files.items():
                    write_atomic(folder / name, data)
                entry["models"].append(model_entry)
            entries.append(entry)
            bar.update(1)
            bar.set_postfix(img_s=f"{bar.n / (time.time() - start):.2f}")
        save_manifest()
    bar.close()
    save_manifest()
    for s in skipped:
        print(f"skipped {s['path']}: {s['reason']}", file=sys.stderr)
    print(f"wrote {len(entries)} image(s) to {out} ({len(skipped)} skipped); manifest: {out / MANIFEST}")
    return 0


def cmd_anatomy(args) -> int:
    out = prepare_out(Path(args.out))
    loaded = hub.load(args.model, device=args.device)
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
    write_atomic(out / f"{name}-position-similarity.png", png_bytes(render.position_tiles(loaded.model)))
    print(f"anatomy of {loaded.name} over {len(images)} image(s) written to {out}")
    return 0


def cmd_models(args) -> int:
    cached = hub.cached_models()
    print(f"{'name':<22} {'source':<48} {'cached':>10}")
    for name, entry in catalog.CATALOG.items():
        size = cached.get(name)
        status = "bundled" if entry.bundled else (f"{size / 1e6:.0f} MB" if size else "-")
        print(f"{name:<22} {entry.source:<48} {status:>10}")
    return 0


def cmd_train(args) -> int:
    from .train import main as train_main
    train_main(args.rest)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vitviz", description="See inside vision transformers.")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("explain", help="explain images: maps, overlays, views and a manifest")
    e.add_argument("paths", nargs="+", help="image files, folders or globs")
    e.add_argument("--models", nargs="+", default=["vit-cifar10", "cvt-cifar10"], help="catalog names, Hub ids or folders")
    e.add_argument("--methods", nargs="+", default=["rollout"], choices=list(METHODS))
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument("--batch-size", type=int, default=8)
    e.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    e.add_argument("--resume", action="store_true", help="skip images whose outputs are complete")
    e.add_argument("--head-fusion", default="mean", choices=explain.HEAD_FUSIONS)
    e.add_argument("--discard-ratio", type=float, default=0.0)
    e.add_argument("--faithfulness-steps", type=int, default=8, help="deletion/insertion steps (0: skip)")
    e.set_defaults(run=cmd_explain)
    a = sub.add_parser("anatomy", help="ViT paper figure 7 views of a model, averaged over images")
    a.add_argument("model")
    a.add_argument("--images", nargs="+", required=True, help="image files, folders or globs")
    a.add_argument("--out", required=True)
    a.add_argument("--limit", type=int, default=256, help="use at most this many images")
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--device", default=None)
    a.set_defaults(run=cmd_anatomy)
    m = sub.add_parser("models", help="the catalog, what is cached and its size")
    m.set_defaults(run=cmd_models)
    t = sub.add_parser("train", help="train a bundled checkpoint (see python -m vitviz.train --help)",
                       add_help=False)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    t.set_defaults(run=cmd_train)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        print("error: --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except (UsageError, hub.LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
