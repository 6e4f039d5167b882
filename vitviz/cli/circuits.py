"""`vitviz circuits`: one photo's circuit of concepts through each model (`vitviz.circuits.photo_circuit`), the graph's
JSON and a picture of it per model, for the same class; nodes the models share (one dictionary across them) framed.

    python -m vitviz circuits PHOTO --models vit-cifar10 cvt-cifar10 --out DIR [--dictionaries SOURCE...]

With --positions a node is a concept (or an error) at one cell of the photo (`circuits.position_circuit`): the
graph's JSON names each node's cell ("#613 @ (2, 3)"), the viewer's file puts it in `ctx_idx`; no picture (hundreds
of nodes) and no adjacency (drawn at its own size).

Beside each graph, what it was pruned from (`circuits.adjacency`: every size up to twice the circuit's, or with
--every-size every size of the ranking, and the edges of every node up to there), to prune it again at another size
with no model pass (`circuits.resized(circuits.load_adjacency(FILE), nodes=K)`).

Every input is checked before anything runs, and the files are written only once every circuit is computed, each
atomically: a bad input writes nothing."""
from __future__ import annotations

import json
from pathlib import Path

from .. import catalog, hub
from ..circuits import (
    BASELINES,
    EDGE_SHARE,
    FAITHFUL,
    IG_STEPS,
    METHODS,
    data_class_circuit,
    data_faithfulness,
    photo_circuit,
    save_adjacency,
)
from ..circuits.classes import file_name as class_file
from ..circuits.neuronpedia import neuronpedia_graph
from ..circuits.pair import places, shared_nodes, sources_for
from ..concepts import ConceptsError
from ..data import open_data, spread
from ..distributed import ranks as process_ranks
from ..files import png_bytes, safe_name, write_atomic
from ..image import ImageError, read_image
from ..render.circuits import circuit_graph
from ..session import ModelRun
from .common import DATA_HELP, UsageError, prepare_out

SHOWN = 5   # the strongest concept nodes printed per model


def file_names(model: str) -> tuple[str, str]:
    """The graph's JSON and its picture, for one model."""
    return f"circuit-{safe_name(model)}.json", f"circuit-{safe_name(model)}.png"


def adjacency_name(model: str) -> str:
    """What the graph was pruned from (`circuits.save_adjacency`), for one model."""
    return f"circuit-{safe_name(model)}.adjacency.safetensors"


def viewer_name(model: str) -> str:
    """The graph in circuit-tracer's file for Neuronpedia's viewer (`--format neuronpedia`), for one model."""
    return f"circuit-{safe_name(model)}.neuronpedia.json"


def curve_name(model: str) -> str:
    """The faithfulness curve over a data set (`--data`), for one model."""
    return f"faithfulness-{safe_name(model)}.json"


def class_index(loaded, name: str | None, what: str) -> int | None:
    """A class name (or its number) -> its index among the model's labels, refused in words."""
    if name is None:
        return None
    labels = list(loaded.labels or ())
    if not labels:
        raise UsageError(f"{loaded.name} has no classifier, so it has no {what} {name!r}.")
    if name in labels:
        return labels.index(name)
    if name.isdigit() and int(name) < len(labels):
        return int(name)
    shown = ", ".join(labels[:12]) + (", ..." if len(labels) > 12 else "")
    raise UsageError(f"--{what.split()[0]} {name!r} is not a class of {loaded.name} ({shown}).")


METRIC_KINDS = {"minus-mean": "logit minus mean", "logit": "logit"}   # --metric's words -> `circuits.METRICS`


def checked(args) -> tuple:
    """Every input, checked before any circuit is computed: (the photo, the loaded models, each one's dictionaries,
    the class names)."""
    if not 0 < args.faithfulness <= 1 or not 0 <= args.edge_share <= 1:
        raise UsageError(f"--faithfulness is from 0 (exclusive) to 1 and --edge-share from 0 to 1, not "
                         f"{args.faithfulness} and {args.edge_share}")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, not {args.steps}")
    if args.positions and (args.every_size or args.data is not None):
        raise UsageError("--positions draws the photo's circuit per position at its own size: it keeps no sizes to "
                         "prune again (--every-size), and --data's curve is of whole concepts; run them apart")
    if args.contrast is not None and args.contrast == args.target:
        raise UsageError(f"--contrast {args.contrast!r} is the class itself: pick another one, or none")
    if len(set(args.models)) != len(args.models):
        raise UsageError(f"--models names a model twice: {' '.join(args.models)}")
    photo = Path(args.photo)
    if not photo.is_file():
        raise UsageError(f"{photo} does not exist" if not photo.exists() else f"{photo} is not a file")
    try:
        image = read_image(photo)
    except ImageError as e:
        raise UsageError(f"{photo}: {e}") from None
    loaded = [hub.load(name, device=args.device) for name in args.models]
    try:
        sources = sources_for(loaded, args.dictionaries)
    except ConceptsError as e:
        raise UsageError(f"--dictionaries: {e}") from None
    for model in loaded:   # the same class for every model: each must have it
        class_index(model, args.target, "class")
        class_index(model, args.contrast, "contrast class")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = None if args.data is None else open_data(args.data, split=args.split)
    return image, loaded, sources, data


def cmd_class_circuits(args) -> int:
    """Each model's circuit of --class over the data set's images of that class (`circuits.data_class_circuit`),
    under torchrun the images split over the processes; its JSON in --out, its F with its interval printed."""
    if args.data is None or args.target is None:
        raise UsageError("without a photo, give --data and --class: the class's circuit over the data set's images of "
                         "that class")
    if args.contrast is not None:
        raise UsageError("a class circuit builds the class's logit minus the mean logit: --contrast needs a photo")
    if not 0 < args.faithfulness <= 1 or not 0 <= args.edge_share <= 1:
        raise UsageError(f"--faithfulness is from 0 (exclusive) to 1 and --edge-share from 0 to 1, not "
                         f"{args.faithfulness} and {args.edge_share}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    data = open_data(args.data, split=args.split)
    with process_ranks(args.device) as ranks:
        loaded = [hub.load(name, device=ranks.device) for name in args.models]
        try:
            sources = sources_for(loaded, args.dictionaries)
        except ConceptsError as e:
            raise UsageError(f"--dictionaries: {e}") from None
        targets = [class_index(model, args.target, "class") for model in loaded]
        graphs = []
        for model, chosen, target in zip(loaded, sources, targets):
            try:
                circuit = data_class_circuit(model, data, dictionaries=chosen, target=target, limit=args.limit,
                                             baseline=args.baseline, faithful=args.faithfulness,
                                             edge_share=args.edge_share, ranks=ranks)
            except ConceptsError as e:
                raise UsageError(f"{model.name}: {e}") from None
            graphs.append(circuit)
        if not ranks.leader:
            return 0
    out = prepare_out(Path(args.out))
    for circuit, chosen in zip(graphs, sources):
        f = circuit.faithfulness
        value = "undefined" if f["value"] is None else \
            f"{f['value']:.3f} ({f['level']:.0%} interval {f['interval'][0]:.3f} to {f['interval'][1]:.3f})"
        print(f"{circuit.model}: {circuit.metric} over {f['images']} images of {data.name} through "
              f"{', '.join(chosen)}")
        print(f"  F = {value} with {f['concept_nodes']} concepts and {f['error_nodes']} error nodes of "
              f"{f['ranked_nodes']} ranked nodes")
        print_strongest(circuit)
        write_atomic(out / class_file(circuit.model, circuit.target_label),
                     (json.dumps(circuit.to_json(), indent=1) + "\n").encode())
    print(f"wrote {len(graphs)} files to {out}: "
          + ", ".join(class_file(c.model, c.target_label) for c in graphs))
    return 0


def cmd_circuits(args) -> int:
    """Each model's circuit of the photo (the same class for all: by default the first model's top class), its JSON
    and picture in --out, its size, faithfulness and strongest nodes printed; without a photo, the class's circuit
    over the data set (`cmd_class_circuits`)."""
    if args.photo is None:
        return cmd_class_circuits(args)
    image, loaded, sources, data = checked(args)
    runs = [ModelRun(model, image) for model in loaded]
    first = next((run for run in runs if run.has_classifier), None)
    target = args.target if args.target is not None or first is None else first.top(1)[0].label
    graphs, adjacencies = [], []
    for model, chosen in zip(loaded, sources):
        try:
            circuit = photo_circuit(model, image, dictionaries=chosen, target=class_index(model, target, "class"),
                                    contrast=class_index(model, args.contrast, "contrast class"),
                                    metric=METRIC_KINDS[args.metric] if args.contrast is None else "contrast",
                                    baseline=args.baseline, method=args.method, steps=args.steps, frozen=args.frozen,
                                    faithful=args.faithfulness, edge_share=args.edge_share, positions=args.positions,
                                    **({} if args.positions else {"every": args.every_size}))
        except ConceptsError as e:
            raise UsageError(f"{model.name}: {e}") from None
        graphs.append(circuit.to_json())
        adjacencies.append(circuit.adjacency)
        report(circuit, chosen)
    curves = []
    for model, chosen in zip(loaded, sources) if data is not None else ():   # each image's own circuit, averaged
        try:
            curves.append(data_faithfulness(model, data, dictionaries=chosen, indices=spread(len(data), args.limit),
                                            baseline=args.baseline, method=args.method, steps=args.steps,
                                            frozen=args.frozen, faithful=args.faithfulness))
        except ConceptsError as e:
            raise UsageError(f"{model.name}: {e}") from None
        print(f"{model.name} over {curves[-1]['images']} images of {data.name}: F by share of each image's ranked "
              f"nodes " + ", ".join(f"{p['fraction']:.1f} {p['faithfulness']:.2f} ({p['nodes']:.0f} nodes)"
                                    for p in curves[-1]["curve"] if p["faithfulness"] is not None))
    shared = shared_nodes(graphs)
    if shared[0]:
        print(f"{len(shared[0])} concept(s) of one dictionary across the models are in every circuit (framed green)")
    out = prepare_out(Path(args.out))
    size = (image.height, image.width)
    for run, graph, mine, adjacency in zip(runs, graphs, shared, adjacencies):
        data, picture = file_names(run.name)
        write_atomic(out / data, (json.dumps(graph, indent=1) + "\n").encode())
        if args.positions:
            continue
        drawn = circuit_graph(graph, run.canvas, places(run.trace, run.loaded.transform, size, graph), shared=mine)
        write_atomic(out / picture, png_bytes(drawn))
        save_adjacency(adjacency, out / adjacency_name(run.name))
    for run, curve in zip(runs, curves):
        write_atomic(out / curve_name(run.name), (json.dumps(curve, indent=1) + "\n").encode())
    viewers = runs if args.format == "neuronpedia" else []
    for run, graph, chosen in zip(viewers, graphs, sources):
        probability = float(run.trace.logits[0].softmax(-1)[graph["target"]])
        viewer = neuronpedia_graph(graph, depth=len(run.trace.blocks), prompt=Path(args.photo).name,
                                   probability=probability, dictionaries=chosen)
        write_atomic(out / viewer_name(run.name), (json.dumps(viewer, indent=1) + "\n").encode())
    written = [n for run in runs for n in ((file_names(run.name)[0],) if args.positions else
                                           (*file_names(run.name), adjacency_name(run.name)))] \
        + [curve_name(run.name) for run in runs[:len(curves)]] + [viewer_name(run.name) for run in viewers]
    print(f"wrote {len(written)} files to {out}: " + ", ".join(written))
    return 0


def report(circuit, sources: list[str]) -> None:
    """A circuit's size, faithfulness and strongest concept nodes, printed."""
    f, size = circuit.faithfulness, circuit.size
    value = "undefined" if f.get("value") is None else f"{f['value']:.3f}"
    completeness = "undefined" if f.get("completeness") is None else f"{f['completeness']:.3f}"
    print(f"{circuit.model}: {circuit.metric} = {circuit.value:.3f} through {', '.join(sources)}")
    print(f"  F = {value} (m(C) {f['circuit']:.3f}, m(∅) {f['empty']:.3f}, m(M) {f['full']:.3f}) with "
          f"{f['concept_nodes']} of the {f['active_concepts']} active concepts and {f['error_nodes']} error nodes, "
          f"the smallest ranked circuit reaching F {f['target']:.2f}; completeness {completeness}; "
          f"{size['nodes']} nodes drawn, {size['edges']} edges ({circuit.method}, {circuit.baseline} baseline, "
          f"attention {circuit.attention.split(' (')[0]})")
    if circuit.adjacency is not None:
        held = circuit.adjacency.held
        at_held = f["curve"][held]["faithfulness"]   # every size up to `held` measured: the curve's point `held`
        print(f"  kept to prune again with no model pass: every size up to {held} nodes"
              + ("" if at_held is None else f" (F {at_held:.3f} there)"))
    print_strongest(circuit)
    for note in circuit.notes:
        print(f"  note: {note}")


def print_strongest(circuit) -> None:
    """A circuit's strongest concept nodes drawn one by one, a line each: block (the app's count), effect, name."""
    strongest = sorted((n for n in circuit.nodes if n.kind == "concept"), key=lambda n: -abs(n.effect))[:SHOWN]
    for node in strongest:
        print(f"  block {node.block + 1:>2}  {node.effect:+.3f}  {node.name}")


def add_parser(sub) -> None:
    """`circuits` under the main parser."""
    c = sub.add_parser("circuits", help="one photo's circuit of concepts through each model: the graph as JSON and "
                                        "a picture")
    c.add_argument("photo", nargs="?", default=None,
                   help="an image file; without one, --data and --class give the class's circuit over the data set")
    c.add_argument("--models", nargs="+", default=list(catalog.BUNDLED_PAIR), help="catalog names, Hub ids or folders")
    c.add_argument("--dictionaries", nargs="+", default=None, metavar="SOURCE",
                   help="concept dictionaries (bundled names, folders, files, Hub ids), each used for the model it "
                        "was trained on (one across models: for each of them; a folder of block<N> folders: each "
                        "block); default: the bundled models' circuit dictionaries")
    c.add_argument("--out", required=True, help="output folder")
    c.add_argument("--class", dest="target", default=None, metavar="NAME",
                   help="the class whose logit the circuit builds (default: the first model's top class)")
    c.add_argument("--metric", default="minus-mean", choices=list(METRIC_KINDS),
                   help="what the circuit builds: the class's logit minus the mean logit (default; circuit-tracer's), "
                        "or its logit alone; --contrast makes it the logit minus the contrast class's")
    c.add_argument("--contrast", default=None, metavar="NAME", help="a class whose logit is subtracted")
    c.add_argument("--baseline", default="zero", choices=BASELINES,
                   help="what a node taken out is set to: zero, or its mean over a data set (means.safetensors)")
    c.add_argument("--method", default="atp", choices=METHODS,
                   help="node effects by attribution patching (atp) or integrated gradients (ig)")
    c.add_argument("--steps", type=int, default=IG_STEPS, help="integrated gradients' steps")
    c.add_argument("--frozen", action="store_true", help="hold attention patterns and norm scales fixed")
    c.add_argument("--faithfulness", type=float, default=FAITHFUL,
                   help="the F the circuit must reach: the smallest set of nodes, ranked by |effect| across all "
                        "blocks, that reaches it")
    c.add_argument("--every-size", action="store_true",
                   help="keep every size of the ranking in the adjacency file beside the graph, not only up to twice "
                        "the circuit's (slower: twice the time on the bundled pair)")
    c.add_argument("--positions", action="store_true",
                   help="a node is a concept (or an error) at one cell of the photo: its effect there, the faithful "
                        "circuit and the edges per position (JSON only: no picture, no adjacency file)")
    c.add_argument("--data", default=None, help="also the faithfulness curve over a data set (each image's circuit of "
                                                "its top class; faithfulness-<model>.json): " + DATA_HELP)
    c.add_argument("--split", default="test", help="the .npz's split to read (default: test)")
    c.add_argument("--limit", type=int, default=None, help="at most this many images, spread evenly over the data")
    c.add_argument("--edge-share", type=float, default=EDGE_SHARE,
                   help="an edge is kept at this share of its target's inflow")
    c.add_argument("--format", default="vitviz", choices=["vitviz", "neuronpedia"],
                   help="neuronpedia: also circuit-<model>.neuronpedia.json, circuit-tracer's graph file for "
                        "Neuronpedia's attribution-graph viewer")
    c.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    c.set_defaults(run=cmd_circuits)
