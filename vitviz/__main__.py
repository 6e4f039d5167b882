"""vitviz's command line.

    python -m vitviz explain PATH... --models vit-base cvt-13 --methods rollout grad-rollout chefer --out DIR
    python -m vitviz evaluate --models vit-cifar10 cvt-cifar10 --data DIR|FILE.npz|cifar10 --limit N --out DIR
    python -m vitviz compare --models vit-cifar10 cvt-cifar10 --data DIR|FILE.npz|cifar10 --limit N --out DIR
    python -m vitviz video CLIP.mp4... --models vit-base cvt-13 --methods rollout chefer --fps 8 --out DIR
    python -m vitviz anatomy MODEL --images DIR --out DIR
    python -m vitviz models
    python -m vitviz train --arch vit-cifar --out checkpoints/vit-cifar10
    python -m vitviz concepts train --models vit-cifar10 --block -1 --data FILE.npz --kind topk --k 32 --out DIR
    python -m vitviz data cifar10 [--out FILE.npz]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from . import catalog, explain, hub, render
from .compare import TOKENS
from .data import CIFAR10_FILE, CIFAR10_VARIABLE, IMAGE_SUFFIXES, DataError, cached_cifar10, cifar10_file, make_cifar10
from .distributed import ranks as process_ranks
from .explain import METHODS
from .export import FORMATS, MANIFEST, export_image, manifest, write_manifest
from .files import drawing_threads, png_bytes, safe_name, write_atomic
from .image import ImageError, read_image
from .session import decode_side, explain_images, faithfulness_curves

DATA_HELP = ("a folder (class sub-folders give labels), an .npz in the layout of cifar10_jpeg.npz, cifar10 (that "
             "file where vitviz finds it: $VITVIZ_CIFAR10, ../shared/data/ beside the repository, ~/.cache/vitviz/; "
             "`vitviz data cifar10` makes it) or cifar10-test (torchvision's test split)")
SIZE_HELP = ("input size in px (square) to run the models at, resized and cropped by each checkpoint's own rule "
             "(default: the catalog's size, e.g. 224 for DINOv2, else the checkpoint's own)")


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


def complete(out: Path, entry: dict | None, models: list[str], methods: list[str], formats: list[str],
             decide: bool = False, concepts: dict[str, str] | None = None) -> bool:
    """Whether a previous run's manifest entry already holds every requested output, on disk. `concepts`: the
    dictionary each model's codes are asked of (model name -> its source), where --concepts is given."""
    if not entry:
        return False
    done = {m["model"]: m for m in entry.get("models", [])}
    for name in models:
        model = done.get(name)
        if model is None or set(methods) - set(model.get("maps", {})):
            return False
        if {f"{m}.{ext}" for m in methods for ext in formats} - set(model.get("files", [])):
            return False
        if decide and "decide" not in model:
            return False
        if name in (concepts or {}) and (model.get("concepts") or {}).get("dictionary") != concepts[name]:
            return False
        folder = out / entry["id"] / safe_name(name)
        if not all((folder / f).is_file() for f in model.get("files", [])):
            return False
    return True


def previous_entries(out: Path) -> dict[str, dict]:
    """The image entries of earlier runs' manifests (merged, and each rank's own), by image path."""
    entries = {}
    for path in sorted(out.glob("manifest*.json")):
        entries.update({e["path"]: e for e in json.loads(path.read_text()).get("images", [])})
    return entries


def cmd_explain(args) -> int:
    """Sharded by image under torchrun: whole batches dealt to the ranks, each rank writing its images'
    folders and its own manifest (manifest-rank<r>.json), rank 0 the merged manifest.json."""
    out = prepare_out(Path(args.out))
    paths = expand_paths(args.paths)
    methods = list(dict.fromkeys(args.methods))
    formats = list(dict.fromkeys(args.formats))
    params = {"head_fusion": args.head_fusion, "discard_ratio": args.discard_ratio}
    with process_ranks(args.device) as ranks:
        models = [hub.load(name, device=ranks.device, size=args.size) for name in args.models]
        names = [m.name for m in models]
        concept_readers = dictionaries_for(models, args.concepts) if args.concepts else None
        concept_sources = {name: reader.source for name, reader in zip(names, concept_readers or []) if reader}
        done = previous_entries(out) if args.resume else {}
        items = list(zip(paths, image_ids(paths)))
        chunks = ranks.mine([items[i:i + args.batch_size] for i in range(0, len(items), args.batch_size)])
        entries, skipped, todo = [], [], []
        for chunk in chunks:
            finished = [(p, i) for p, i in chunk if complete(out, done.get(str(p)), names, methods, formats,
                                                                args.decide, concept_sources)]
            entries += [done[str(p)] for p, _ in finished]
            todo.append([item for item in chunk if item not in finished])
        if args.resume:
            print(f"resume{f' (rank {ranks.rank})' if ranks.world > 1 else ''}: {len(entries)} image(s) already "
                  f"complete, {sum(map(len, todo))} to do", file=sys.stderr)
        own_manifest = out / (MANIFEST if ranks.world == 1 else f"manifest-rank{ranks.rank}.json")

        def save_manifest(path: Path, images: list[dict], skips: list[dict]) -> None:
            write_manifest(path.parent, manifest(models=models, methods=methods, params=params, images=images,
                                                 skipped=skips, faithfulness_steps=args.faithfulness_steps),
                           name=path.name)

        target = decode_side(models)
        bar = tqdm(total=sum(map(len, todo)), unit="image", desc="explain", file=sys.stderr, disable=not ranks.leader)
        start = time.time()
        pending = []   # the previous batch's exports: collected once the next batch's forwards are done

        def collect(exports) -> None:
            for export in exports:
                entries.append(export.result())
                bar.update(1)
                bar.set_postfix(img_s=f"{bar.n / (time.time() - start):.2f}")
            if exports:
                save_manifest(own_manifest, entries, skipped)

        # drawing and encoding release the GIL for most of their time: one image (all its models) per thread, and
        # numpy's BLAS on one thread inside them (`files.drawing_threads`)
        with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool, drawing_threads():
            for chunk in todo:
                batch = []
                for path, image_id in chunk:
                    try:
                        batch.append((path, image_id, read_image(path, target_size=target)))
                    except ImageError as e:
                        skipped.append({"path": str(path), "reason": str(e)})
                        bar.update(1)
                if not batch:
                    continue
                images, preprocessed = [image for _, _, image in batch], {}
                runs_per_model = [explain_images(images, loaded, batch_size=args.batch_size, preprocessed=preprocessed)
                                  for loaded in models]
                for runs in runs_per_model:   # the batch's curves in batched forwards, kept in the runs for export
                    classified = [run for run in runs if run.has_classifier]
                    for method in methods if args.faithfulness_steps and classified else ():
                        faithfulness_curves(classified, method, steps=args.faithfulness_steps)
                collect(pending)
                pending = [pool.submit(export_image, out, image_id, path, image, [runs[k] for runs in runs_per_model],
                                       methods, formats=formats, faithfulness_steps=args.faithfulness_steps,
                                       params=params, decide=args.decide, concepts=concept_readers)
                           for k, (path, image_id, image) in enumerate(batch)]
            collect(pending)
        bar.close()
        save_manifest(own_manifest, entries, skipped)
        gathered = ranks.gather(json.dumps({"images": entries, "skipped": skipped}))
        if not ranks.leader:
            return 0
        parts = [json.loads(text) for text in gathered]
        order = {str(path): k for k, (path, _) in enumerate(items)}
        entries = sorted((e for part in parts for e in part["images"]), key=lambda e: order[e["path"]])
        skipped = sorted((s for part in parts for s in part["skipped"]), key=lambda s: order[s["path"]])
        save_manifest(out / MANIFEST, entries, skipped)
    for s in skipped:
        print(f"skipped {s['path']}: {s['reason']}", file=sys.stderr)
    print(f"wrote {len(entries)} image(s) to {out} ({len(skipped)} skipped); manifest: {out / MANIFEST}")
    return 0


def dictionaries_for(models: list, sources: list[str]) -> list:
    """Each model's dictionary among `sources` (`concepts.analysis.photo.readers`), refused as a usage error in
    words."""
    from .concepts import ConceptsError
    from .concepts.analysis.photo import readers

    try:
        return readers(models, sources)
    except ConceptsError as e:
        raise UsageError(f"--concepts: {e}") from None


def cmd_evaluate(args) -> int:
    from .evaluate import Settings, evaluate

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


def cmd_compare(args) -> int:
    from .compare import MIN_BATCH, compare

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


def cmd_anatomy(args) -> int:
    out = prepare_out(Path(args.out))
    loaded = hub.load(args.model, device=args.device, size=args.size)
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
    write_atomic(out / f"{name}-position-similarity.png",
                 png_bytes(render.position_tiles(render.position_embedding(loaded.model))))
    print(f"anatomy of {loaded.name} over {len(images)} image(s) written to {out}")
    return 0


def cmd_video(args) -> int:
    """Each video through the models frame by frame: OUT/<clip>/side-by-side.mp4 and the rest (`vitviz.video`)."""
    from .video import VideoError, explain_video

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


def cmd_concepts_train(args) -> int:
    from .concepts import ConceptsError
    from .concepts.build import cache_layers, train_layers
    from .data import open_data, spread

    out = prepare_out(Path(args.out))
    blocks = args.block * len(args.models) if len(args.block) == 1 else args.block
    if len(blocks) != len(args.models):
        raise UsageError(f"--block takes one block for every model, or one per model: {len(args.block)} given for "
                         f"{len(args.models)} models")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = open_data(args.data, split=args.split)
    settings = {"kind": args.kind, "expansion": args.expansion, "epochs": args.epochs, "steps": args.steps,
                "warmup": args.warmup, "buffer": args.shuffle_buffer, "batch_size": args.batch_size, "lr": args.lr,
                "seed": args.seed,
                **({"k": args.k} if args.k is not None else {}), **({"l1": args.l1} if args.l1 is not None else {})}
    try:
        with process_ranks(args.device) as ranks, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # a poor fit is said below, in the command's own words
            loaded = [hub.load(name, device=ranks.device) for name in args.models]
            layers = cache_layers(loaded, data, blocks=blocks, tokens=args.tokens, root=args.cache,
                                  indices=spread(len(data), args.limit), ranks=ranks)
            record = train_layers(loaded, layers, out=out, leader=ranks.leader, device=ranks.device,
                                  **settings).training_record
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    fvu = record["fvu"] if isinstance(record["fvu"], dict) else {args.models[0]: record["fvu"]}
    print(f"trained {record['steps']} steps ({record['epochs']} passes over the data, {record['tokens']:,} tokens); "
          f"FVU on its training tokens: " + ", ".join(f"{model} {value:.3f}" for model, value in fvu.items()))
    if "warning" in record:
        print(f"warning: {record['warning']}", file=sys.stderr)
    print(f"wrote the dictionary to {out}")
    return 0


def cmd_concepts_exemplars(args) -> int:
    from .concepts import ConceptsError, load
    from .concepts.build import exemplar_indexes
    from .data import open_data, spread

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    if not 1 <= args.jpeg_quality <= 95:
        raise UsageError(f"--jpeg-quality must be from 1 to 95, not {args.jpeg_quality}")
    data = open_data(args.data, split=args.split)
    try:
        dictionary = load(args.dictionary)
        folder = Path(args.dictionary)
        if not folder.is_dir():
            raise UsageError(f"{args.dictionary} is not a folder: the exemplar index is written into the "
                             f"dictionary's folder")
        names = getattr(dictionary, "models", None) or [dictionary.model]
        with process_ranks(args.device) as ranks:
            loaded = [hub.load(name, device=ranks.device) for name in names]
            files = exemplar_indexes(loaded, dictionary, data, folder=folder, root=args.cache, top=args.top,
                                     quality=args.jpeg_quality,
                                     indices=spread(len(data), args.limit), ranks=ranks)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    for file in files:
        print(f"wrote {file} ({file.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_concepts_evaluate(args) -> int:
    from .concepts import ConceptsError, load
    from .concepts.build import evaluate_dictionary
    from .data import open_data, spread

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = open_data(args.data, split=args.split)
    try:
        dictionary = load(args.dictionary)
        names = getattr(dictionary, "models", None) or [dictionary.model]
        loaded = [hub.load(name, device=args.device) for name in names]
        report = evaluate_dictionary(loaded, dictionary, data, root=args.cache, indices=spread(len(data), args.limit))
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out) if args.out else (Path(args.dictionary) / "metrics.json")
    prepare_out(out.parent)
    write_atomic(out, (json.dumps(report, indent=1) + "\n").encode())
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, list) or len(v) < 8}, indent=1))
    print(f"wrote {out}")
    return 0


def cmd_concepts_match(args) -> int:
    from .concepts import ConceptsError, load
    from .concepts.analysis.match import Side, match
    from .data import open_data, spread

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = open_data(args.data, split=args.split)
    out = prepare_out(Path(args.out))
    try:
        sides = []
        for source in (args.a, args.b):
            dictionary = load(source)
            if dictionary.model is None:
                raise UsageError(f"{source} does not record its model: matching needs to know which to run")
            sides.append(Side(hub.load(dictionary.model, device=args.device), dictionary))
        matches = match(*sides, data, indices=spread(len(data), args.limit), keep_matrix=args.matrix)
        matches.save(out)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    best = ", ".join(f"{int(a)}-{int(b)} ({r:.2f})" for (a, b), r in zip(matches.pairs[:5].tolist(),
                                                                         matches.correlation[:5].tolist()))
    print(f"{len(matches.pairs)} pairs over {matches.rows} cells of {matches.images} images; the closest: {best}")
    print(f"wrote {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vitviz", description="See inside vision transformers.")
    sub = p.add_subparsers(dest="command", required=True)
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
    a = sub.add_parser("anatomy", help="ViT paper figure 7 views of a model, averaged over images")
    a.add_argument("model")
    a.add_argument("--images", nargs="+", required=True, help="image files, folders or globs")
    a.add_argument("--out", required=True)
    a.add_argument("--limit", type=int, default=256, help="use at most this many images")
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--device", default=None)
    a.add_argument("--size", type=int, default=None, help=SIZE_HELP)
    a.set_defaults(run=cmd_anatomy)
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
    m = sub.add_parser("models", help="the catalog, what is cached and its size")
    m.set_defaults(run=cmd_models)
    t = sub.add_parser("train", help="train a bundled checkpoint (see python -m vitviz.train --help)",
                       add_help=False)
    t.add_argument("rest", nargs=argparse.REMAINDER)
    t.set_defaults(run=cmd_train)
    concepts_parser(sub)
    d = sub.add_parser("data", help="make the data sets vitviz reads")
    data_sets = d.add_subparsers(dest="data_command", required=True)
    cifar_help = ("make cifar10_jpeg.npz (what --data cifar10 and the tests read) from the public CIFAR-10 "
                  "download (about 170 MB; needs a network)")
    cifar = data_sets.add_parser("cifar10", help=cifar_help, description=f"{cifar_help[0].upper()}{cifar_help[1:]}.")
    cifar.add_argument("--out", default=None, help="the file to write (default: cifar10_jpeg.npz in the user's "
                                                   "cache, $XDG_CACHE_HOME/vitviz/ or ~/.cache/vitviz/, where vitviz "
                                                   "looks last)")
    cifar.set_defaults(run=cmd_data_cifar10)
    return p


def concepts_parser(sub) -> None:
    """`concepts train` (and the other concept commands) under the main parser."""
    from .concepts.activations.cache import TOKENS as CONCEPT_TOKENS
    from .concepts.build import DEFAULT_CACHE
    from .concepts.kinds import KINDS

    k = sub.add_parser("concepts", help="concept dictionaries (sparse autoencoders): train, evaluate, match")
    commands = k.add_subparsers(dest="concepts_command", required=True)
    t = commands.add_parser("train", help="train a dictionary of one model's block, or one across two or more "
                                          "models (torchrun makes it data-parallel)")
    t.add_argument("--models", nargs="+", required=True, help="catalog names, Hub ids or folders; two or more: one "
                                                              "dictionary across them, on their aligned grids")
    t.add_argument("--block", nargs="+", type=int, default=[-1],
                   help="the block whose output tokens are read (from 0; negative from the end): one for every "
                        "model or one per model (default: the last)")
    t.add_argument("--tokens", default=None, choices=CONCEPT_TOKENS,
                   help="which tokens: patch (default; a CNN's are its positions), cls, patch+cls")
    t.add_argument("--data", required=True, help=DATA_HELP)
    t.add_argument("--split", default="train", help="the .npz's split to read (default: train)")
    t.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    t.add_argument("--kind", default="topk", choices=list(KINDS))
    t.add_argument("--k", type=int, default=None, help="TopK and BatchTopK: concepts per token (default 32)")
    t.add_argument("--l1", type=float, default=None, help="standard: the L1 coefficient (default 1.0)")
    t.add_argument("--expansion", type=int, default=8, help="concepts per activation dimension (default 8)")
    t.add_argument("--steps", type=int, default=None,
                   help="training steps in all (default: one pass over the data, and at least 2 M tokens: enough for a "
                        "few thousand photos to give a usable dictionary)")
    t.add_argument("--epochs", type=int, default=None, help="whole passes over the data instead of --steps")
    t.add_argument("--warmup", type=int, default=None,
                   help="steps over which the learning rate warms up (default: a tenth of the run, at most 100)")
    t.add_argument("--batch-size", type=int, default=4096, help="tokens per training step (default 4096)")
    t.add_argument("--shuffle-buffer", type=int, default=None,
                   help="stream one model's cached layer from disk, this many shards of 1,024 images shuffled "
                        "together (default: in memory when the layer fits in a quarter of the memory, else streamed "
                        "with 4)")
    t.add_argument("--lr", type=float, default=4e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--cache", default=str(DEFAULT_CACHE), help=f"the activation cache's folder (default "
                                                                f"{DEFAULT_CACHE})")
    t.add_argument("--out", required=True, help="output folder: the dictionary, training.json, the checkpoint")
    t.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    t.set_defaults(run=cmd_concepts_train)
    x = commands.add_parser("exemplars", help="index each concept's top images (with its maps) over a data set, "
                                              "into the dictionary's folder, for the Concepts tab")
    x.add_argument("dictionary", help="the dictionary's folder (one model's, or one across models)")
    x.add_argument("--data", required=True, help=DATA_HELP)
    x.add_argument("--split", default="test", help="the .npz's split to read (default: test)")
    x.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    x.add_argument("--top", type=int, default=8, help="images kept per concept (default 8)")
    x.add_argument("--jpeg-quality", type=int, default=90, help="the thumbnails' JPEG quality, 1 to 95 (default 90)")
    x.add_argument("--cache", default=str(DEFAULT_CACHE), help="the activation cache's folder")
    x.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    x.set_defaults(run=cmd_concepts_exemplars)
    v = commands.add_parser("evaluate", help="a dictionary's FVU, L0, dead and dense shares and spliced-in "
                                             "agreement over held-out data; across models, the R² matrix and "
                                             "which concepts the models share")
    v.add_argument("dictionary", help="a dictionary (folder, file, catalog name or Hub id)")
    v.add_argument("--data", required=True, help=DATA_HELP)
    v.add_argument("--split", default="test", help="the .npz's split to read (default: test)")
    v.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    v.add_argument("--out", default=None, help="the report's file (default: metrics.json in the dictionary's folder)")
    v.add_argument("--cache", default=str(DEFAULT_CACHE), help="the activation cache's folder")
    v.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    v.set_defaults(run=cmd_concepts_evaluate)
    h = commands.add_parser("match", help="pair two separately trained dictionaries' concepts one to one by the "
                                          "correlation of their maps at aligned cells (Hungarian)")
    h.add_argument("a", help="the first dictionary (folder, file, catalog name or Hub id)")
    h.add_argument("b", help="the second")
    h.add_argument("--data", required=True, help=DATA_HELP)
    h.add_argument("--split", default="test", help="the .npz's split to read (default: test)")
    h.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    h.add_argument("--out", required=True, help="output folder: matches.json (and with --matrix "
                                                "correlations.safetensors)")
    h.add_argument("--matrix", action="store_true", help="also keep every pair's correlation (n_a x n_b float64)")
    h.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    h.set_defaults(run=cmd_concepts_match)


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


if __name__ == "__main__":
    sys.exit(main())
