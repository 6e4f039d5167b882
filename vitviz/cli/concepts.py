"""`vitviz concepts train / exemplars / evaluate / match / names`: concept dictionaries (`vitviz.concepts`; what
each command does is `vitviz.concepts.build`'s and `vitviz.concepts.analysis`'s `match` and `names`)."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from .. import hub
from ..distributed import ranks as process_ranks
from ..files import write_atomic
from .common import DATA_HELP, UsageError, prepare_out


def cmd_concepts_train(args) -> int:
    from ..concepts import ConceptsError
    from ..concepts.build import block_dictionaries, cache_layers, train_layers
    from ..data import open_data, spread

    out = prepare_out(Path(args.out))
    per_block = len(args.models) == 1 and len(args.block) > 1
    blocks = args.block * len(args.models) if len(args.block) == 1 else args.block
    if len(blocks) != len(args.models) and not per_block:
        raise UsageError(f"--block takes one block for every model, or one per model: {len(args.block)} given for "
                         f"{len(args.models)} models")
    tokens = args.tokens or [None]
    if len(tokens) not in (1, len(args.block) if per_block else 1):
        raise UsageError(f"--tokens takes one kind, or with several blocks of one model one per block: "
                         f"{len(tokens)} given for {len(args.block)} blocks")
    if per_block and len(set(args.block)) != len(args.block):
        raise UsageError(f"--block names a block twice: {' '.join(map(str, args.block))}")
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
            indices = spread(len(data), args.limit)
            if per_block:
                kinds = tokens * (len(blocks) // len(tokens))   # one for all, or one per block
                trained = block_dictionaries(loaded[0], data, blocks=blocks, tokens=kinds, root=args.cache,
                                             indices=indices, ranks=ranks, out=out, **settings)
            else:
                layers = cache_layers(loaded, data, blocks=blocks, tokens=tokens[0], root=args.cache, indices=indices,
                                      ranks=ranks)
                trained = {out: train_layers(loaded, layers, out=out, leader=ranks.leader, device=ranks.device,
                                             **settings)}
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    for folder, dictionary in trained.items():
        record = dictionary.training_record
        fvu = record["fvu"] if isinstance(record["fvu"], dict) else {args.models[0]: record["fvu"]}
        print(f"trained {record['steps']} steps ({record['epochs']} passes over the data, {record['tokens']:,} "
              f"tokens); FVU on its training tokens: " + ", ".join(f"{m} {value:.3f}" for m, value in fvu.items()))
        if "warning" in record:
            print(f"warning: {record['warning']}", file=sys.stderr)
        print(f"wrote the dictionary to {folder}")
    return 0


def cmd_concepts_exemplars(args) -> int:
    from ..concepts import ConceptsError, load
    from ..concepts.build import exemplar_indexes
    from ..data import open_data, spread

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    if not 1 <= args.jpeg_quality <= 95:
        raise UsageError(f"--jpeg-quality must be from 1 to 95, not {args.jpeg_quality}")
    if args.thumbnails is not None and not args.thumbnails.endswith(".safetensors"):
        raise UsageError(f"--thumbnails is a store's .safetensors file, not {args.thumbnails}")
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
                                     quality=args.jpeg_quality, thumbnails=args.thumbnails,
                                     indices=spread(len(data), args.limit), ranks=ranks)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    for file in files:
        print(f"wrote {file} ({file.stat().st_size / 1e6:.2f} MB)")
    return 0


def cmd_concepts_evaluate(args) -> int:
    from ..concepts import ConceptsError, load
    from ..concepts.analysis.means import save_means
    from ..concepts.build import METRICS, evaluate_dictionary
    from ..data import open_data, spread

    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = open_data(args.data, split=args.split)
    try:
        dictionary = load(args.dictionary)
        names = getattr(dictionary, "models", None) or [dictionary.model]
        loaded = [hub.load(name, device=args.device) for name in names]
        report, means = evaluate_dictionary(loaded, dictionary, data, root=args.cache,
                                            indices=spread(len(data), args.limit))
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out) if args.out else (Path(args.dictionary) / METRICS)
    prepare_out(out.parent)
    write_atomic(out, (json.dumps(report, indent=1) + "\n").encode())
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, list) or len(v) < 8}, indent=1))
    print(f"wrote {out}")
    for name, row_means in means.items():   # each read row's mean code and error: a circuit's "mean" baseline
        print(f"wrote {save_means(row_means, out.parent / name)}")
    return 0


def cmd_concepts_match(args) -> int:
    from ..concepts import ConceptsError, load
    from ..concepts.analysis.match import Side, match
    from ..concepts.analysis.names import dictionary_names
    from ..data import open_data, spread

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
    closest = matches.pairs[:5].tolist()
    names = [dictionary_names(source, side.dictionary, [pair[i] for pair in closest])
             for i, (source, side) in enumerate(zip((args.a, args.b), sides))]
    print(f"{len(matches.pairs)} pairs over {matches.rows} cells of {matches.images} images; the closest:")
    for a, b, r in zip(*names, matches.correlation[:5].tolist()):
        print(f"  {a.title}  ~  {b.title}  ({r:.2f})")
    print(f"wrote {out}")
    return 0


def cmd_concepts_names(args) -> int:
    from ..concepts import Across, ConceptsError, load
    from ..concepts.analysis.exemplars import index_in
    from ..concepts.analysis.names import MIN_SHARE, concept_names, nearest_words, word_list

    by_words = args.clip or args.words is not None
    try:
        dictionary = load(args.dictionary)
        if isinstance(dictionary, Across):
            if args.model is None:
                raise UsageError(f"{args.dictionary} is one dictionary across {', '.join(dictionary.models)}: say "
                                 f"which model's concepts to name (--model)")
            dictionary = dictionary.dictionary(args.model)
        concepts = args.concepts or range(dictionary.n_concepts)
        try:
            index = index_in(args.dictionary, dictionary=dictionary)
        except ConceptsError:
            if not by_words:
                raise
            index = None   # named by the words alone
        names = concept_names(index, concepts)
        if by_words:
            nearest = nearest_words(dictionary, hub.load(dictionary.model, device=args.device), concepts=concepts,
                                    words=None if args.words is None else word_list(args.words), top=args.top)
    except ConceptsError as e:
        raise UsageError(str(e)) from None
    if index is not None:
        print(f"{index.model}'s concepts by the classes of their top {index.top} images in {Path(index.data).name} "
              f"(a class named where {100 * MIN_SHARE:.0f} % of them or more are of it)"
              + (", and by the nearest words in CLIP's joint space (cosine):" if by_words else ":"))
    else:
        print(f"{dictionary.model}'s concepts by the nearest words in CLIP's joint space (cosine; no exemplar index "
              f"names their classes):")
    for k, name in enumerate(names):
        words = f"  [{', '.join(f'{word} {cosine:.2f}' for word, cosine in nearest[k])}]" if by_words else ""
        print(name.title + words)
    return 0


def add_parser(sub) -> None:
    """`concepts train` (and the other concept commands) under the main parser."""
    from ..concepts.activations.cache import TOKENS as CONCEPT_TOKENS
    from ..concepts.build import DEFAULT_CACHE
    from ..concepts.kinds import KINDS

    k = sub.add_parser("concepts", help="concept dictionaries (sparse autoencoders): train, evaluate, match")
    commands = k.add_subparsers(dest="concepts_command", required=True)
    t = commands.add_parser("train", help="train a dictionary of one model's block, or one across two or more "
                                          "models (torchrun makes it data-parallel)")
    t.add_argument("--models", nargs="+", required=True, help="catalog names, Hub ids or folders; two or more: one "
                                                              "dictionary across them, on their aligned grids")
    t.add_argument("--block", nargs="+", type=int, default=[-1],
                   help="the block whose output tokens are read (from 0; negative from the end): one for every "
                        "model or one per model (default: the last); with one model, several blocks train one "
                        "dictionary per block from one pass over the data, into OUT/block<N>")
    t.add_argument("--tokens", nargs="+", default=None, choices=CONCEPT_TOKENS,
                   help="which tokens: patch (default; a CNN's are its positions), cls, patch+cls; with several "
                        "blocks of one model, one kind for all or one per block")
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
    x.add_argument("--thumbnails", default=None, metavar="STORE",
                   help="keep the thumbnails in this store (a .safetensors file, made if there is none) that indexes "
                        "over the same data share, each image once, instead of in the index")
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
    m = commands.add_parser("names", help="each concept's name from the classes of its top images (its exemplar "
                                          "index); for a CLIP dictionary, the nearest words by CLIP")
    m.add_argument("dictionary", help="the dictionary (a bundled name, or its folder, with its exemplar index)")
    m.add_argument("--model", default=None, help="of a dictionary across models, the model whose concepts to name")
    m.add_argument("--concepts", nargs="+", type=int, default=None, help="these concepts alone (default: all)")
    m.add_argument("--clip", action="store_true", help="a dictionary of a CLIP image tower: also the words of "
                                                       "vitviz's list nearest to each concept in CLIP's joint space")
    m.add_argument("--words", default=None, metavar="FILE", help="with CLIP, this word list instead (one a line)")
    m.add_argument("--top", type=int, default=3, help="with CLIP, words given per concept (default 3)")
    m.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    m.set_defaults(run=cmd_concepts_names)
