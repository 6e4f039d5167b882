"""The hot loops never make the host wait for a GPU per step: counted on the CPU (tests/syncs.py says what
counts and why a timing could not show it). A training run reads its numbers back once every PROGRESS_EVERY
steps and at the end of each epoch, and nothing else in the loop."""
from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from syncs import counting
from vitviz import concepts
from vitviz.concepts.train import PROGRESS_EVERY, train_across

BATCH = 64
SETTINGS = dict(expansion=4, batch_size=BATCH, warmup=5, dead_after=500, norm_tokens=BATCH, progress=False)
# outside the loop, once a run: the normalisation's checks and the first read of the dead-concept counters before
# it; after it, the finished dictionary's FVU (one read; across models, the R² matrix's statistics on the host)
OUTSIDE = {"single": 6, "across": 20}


def activations(steps: int, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps * BATCH, d, generator=g) * 2 + 1


def single(kind: str):
    return lambda steps: concepts.train(activations(steps), kind=kind, **({} if kind == "standard" else {"k": 4}),
                                        **SETTINGS)


def across(steps: int):
    return train_across([activations(steps), activations(steps, d=8, seed=1)], models=["a", "b"], blocks=None,
                        tokens=None, kind="topk", k=4, **SETTINGS)


@pytest.mark.parametrize("run", [single("topk"), single("batchtopk"), single("standard"), across],
                         ids=["topk", "batchtopk", "standard", "across"])
def test_training_waits_for_the_device_once_per_progress_read_not_per_step(run):
    counts = {}
    for steps in (50, 100):
        with counting() as calls:
            run(steps)
        counts[steps] = sum(calls.values())
    reads = 50 // PROGRESS_EVERY + 1   # every PROGRESS_EVERY steps, and the epoch's end (9 a step before: 450)
    assert counts[50] <= reads + OUTSIDE["across" if run is across else "single"], counts
    assert counts[100] - counts[50] == 50 // PROGRESS_EVERY, counts   # 50 more steps: their reads alone


def test_the_dead_concepts_auxk_revives_are_the_ones_reading_every_step_would_find():
    """AuxK runs when the host's bound on the dead concepts says some may be dead, and takes the top k over that
    bound: with few dead concepts and a bound above them, it equals AuxK over exactly the dead ones."""
    from vitviz.concepts.train import auxk
    g = torch.Generator().manual_seed(0)
    pre, residual, W_dec = torch.randn(32, 12, generator=g), torch.randn(32, 5, generator=g), torch.randn(12, 5,
                                                                                                         generator=g)
    dead = torch.zeros(12, dtype=torch.bool)
    dead[[2, 7, 9]] = True
    exact = auxk(pre, residual, dead, W_dec, 3)   # k = the number dead
    assert torch.equal(auxk(pre, residual, dead, W_dec, 8), exact)   # a bound above it: the others masked to 0
    assert torch.equal(auxk(pre, residual, dead, W_dec, 512), exact)


def test_caching_activations_never_waits_for_the_device_per_batch(tmp_path):
    """The loop that drives the traced forwards reads nothing back: 6 more batches, no more waits (the
    background writer waits for each shard's copies; the probe and the cache's key are before the loop)."""
    from PIL import Image

    from vitviz import hub
    from vitviz.concepts.activations import cache_activations
    from vitviz.data import Dataset

    vit = hub.load("vit-cifar10", device="cpu")
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8).numpy())
              for _ in range(16)]
    counts = {}
    for n in (4, 16):
        data = Dataset(name=f"{n} photos", ids=tuple(map(str, range(n))), labels=None, classes=None,
                       source=images.__getitem__)
        with counting() as calls:
            cache_activations(vit, data, block=-1, root=tmp_path, batch_size=2, progress=False)
        counts[n] = sum(calls.values())
    assert counts[16] == counts[4], counts


# ---- the explanation methods: a fixed number of waits per call, none per block, position or image ----------------
# Each method runs on small random models at two sizes (more blocks, more positions, more images) and must wait the
# same number of times, within the bound its test states: reading its result back once, at the end, and the
# checks of what it was given at the start.

def tiny(family: str, depth: int) -> torch.nn.Module:
    """A random-weight model of `family` for 32 px inputs, with `depth` blocks (a Swin and a ResNet: per stage)."""
    from vitviz.models import ResNet, ResNetConfig, Swin, SwinConfig, ViT, ViTConfig

    torch.manual_seed(0)
    if family == "vit":
        model = ViT(ViTConfig(img_size=(32, 32), patch_size=8, embed_dim=16, depth=depth, num_heads=2, num_classes=5))
    elif family == "swin":   # a 16 x 16 grid in 4 x 4 windows, shifted every second block, then an 8 x 8 one
        model = Swin(SwinConfig(img_size=(32, 32), patch_size=2, embed_dim=8, depths=(depth, depth), num_heads=(1, 2),
                                window_size=4, num_classes=5))
    else:
        model = ResNet(ResNetConfig(block="basic", layers=(depth, depth), widths=(8, 16), stem_width=8, stem_kernel=3,
                                    num_classes=5))
    return model.eval()


def waits(function, *args, **kwargs) -> int:
    """How many times `function(*args, **kwargs)` would make the host wait for a GPU."""
    with counting() as calls:
        function(*args, **kwargs)
    return sum(calls.values())


@pytest.mark.parametrize("family", ["vit", "swin", "resnet"])
def test_receptive_fields_read_every_blocks_radii_back_once(family):
    """The centre token comes from the geometry on the host; the radii of every block come back in one read."""
    from vitviz import explain

    pixels = torch.randn(2, 3, 32, 32)
    models = {depth: tiny(family, depth) for depth in (1, 3)}
    counts = {depth: waits(explain.receptive_field, model, pixels) for depth, model in models.items()}
    assert counts == {1: 1, 3: 1}


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_direct_logit_attribution_and_token_effects_never_wait_for_the_device(family):
    """Nothing is read back: the parts and the maps stay on the trace's device. A target and a foil given by the
    caller are checked (each in the model's range, and not the same class): three reads, whatever the depth."""
    from vitviz import explain

    def attribution_and_maps(model, trace):
        return explain.decide.token_effect_maps(explain.direct_logit_attribution(model, trace), trace)

    pixels = torch.randn(2, 3, 32, 32)
    counts, checked = {}, {}
    for depth in (1, 3):
        model = tiny(family, depth)
        with torch.no_grad():
            trace = model.trace(pixels, decompose=True)
        counts[depth] = waits(attribution_and_maps, model, trace)
        checked[depth] = waits(explain.direct_logit_attribution, model, trace, target=1, foil=2)
    assert counts == {1: 0, 3: 0} and checked == {1: 3, 3: 3}


def test_activation_patching_reads_its_metric_twice_whatever_the_blocks_and_positions():
    """The metric's classes, then m on the clean and corrupted runs; the patched forwards' effects stay on the
    device: 1 block of 4 squares and a class token against 3 blocks of 16 tokens and a class token, and heads."""
    from vitviz import explain

    clean = torch.randn(1, 3, 32, 32)
    corrupted = explain.corrupt(clean, "noise")
    models = {depth: tiny("vit", depth) for depth in (1, 3)}
    resid = {depth: waits(explain.patch_activations, model, clean, corrupted, group=2 if depth == 1 else 1,
                          batch_size=4) for depth, model in models.items()}
    heads = {depth: waits(explain.patch_activations, model, clean, corrupted, site="head", batch_size=1)
             for depth, model in models.items()}
    assert resid == heads == {1: 2, 3: 2}


@pytest.mark.parametrize("method", ["rollout", "grad-rollout", "chefer"])
def test_rollout_through_swins_windows_never_waits_for_the_device(method):
    from vitviz.explain import METHODS

    pixels = torch.randn(2, 3, 32, 32)
    counts = {}
    for depth in (1, 3):
        model = tiny("swin", depth)
        if METHODS[method].targeted:
            counts[depth] = waits(METHODS[method].maps, model, pixels, None, to_stage=0)
        else:
            with torch.no_grad():
                trace = model.trace(pixels)
            counts[depth] = waits(METHODS[method].from_trace, trace, to_stage=0)
    assert counts == {1: 0, 3: 0}


@contextlib.contextmanager
def copies_to_the_device():
    """Count copies of host data to another device (`Tensor.to` of a host tensor, `torch.tensor` and
    `torch.as_tensor` of host values with a device). On a GPU such a copy from ordinary host memory waits until the
    device has done everything queued before it, as a read back does; on the meta device (shapes without data) a
    CPU can count them."""
    copies = collections.Counter()
    to, tensor, as_tensor = torch.Tensor.to, torch.tensor, torch.as_tensor

    def counted_to(self, *args, **kwargs):
        moved = to(self, *args, **kwargs)
        if self.device.type == "cpu" and moved.device.type != "cpu":
            copies[f"Tensor.to {tuple(self.shape)}"] += 1
        return moved

    def counted(factory):
        def made(data, *args, **kwargs):
            out = factory(data, *args, **kwargs)
            if out.device.type != "cpu" and not (isinstance(data, torch.Tensor) and data.device == out.device):
                copies[f"torch.{factory.__name__} {tuple(out.shape)}"] += 1
            return out
        return made

    torch.Tensor.to, torch.tensor, torch.as_tensor = counted_to, counted(tensor), counted(as_tensor)
    try:
        yield copies
    finally:
        torch.Tensor.to, torch.tensor, torch.as_tensor = to, tensor, as_tensor


@pytest.mark.parametrize("family", ["vit", "swin"])
def test_the_forward_and_rollout_copy_nothing_to_the_device_after_the_first_pass(family):
    """Swin's window index, shifted windows' mask and relative position index are made on the device once and
    kept, and rollout's discarding never sends the class column's index: a second pass copies nothing, at any
    depth."""
    from vitviz import explain

    pixels = torch.randn(1, 3, 32, 32, device="meta")
    copies = {}
    for depth in (1, 3):
        model = tiny(family, depth).to("meta")
        with torch.no_grad():
            explain.attention_rollout(model.trace(pixels), to_stage=0)   # the first pass on a device: kept there
            with copies_to_the_device() as copied:
                model(pixels)
                explain.attention_rollout(model.trace(pixels), to_stage=0)
                explain.attention_rollout(model.trace(pixels), to_stage=0, discard_ratio=0.5)
        copies[depth] = dict(copied)
    assert copies == {1: {}, 3: {}}


def test_an_evaluation_batch_waits_a_fixed_number_of_times_whatever_its_images():
    """`evaluate`'s batch of 2 and of 6 images (4 perturbed images a forward: many more forwards) wait the same: three
    reads of the device (LeGrad's check of its target, every forward's answers at once, the batch's predictions,
    references and probabilities at once) and twelve conversions of host tensors to lists (the deletion and
    insertion schedules, and each of the five tests' fractions and curves), none per image or per forward."""
    from vitviz import hub
    from vitviz.evaluate import Settings, evaluate_batch

    loaded = hub.load("vit-cifar10", device="cpu")
    settings = Settings(steps=4, regions=8, forward_batch=4)
    counts = {}
    for images in (2, 6):
        pixels = torch.randn(images, 3, 32, 32)
        counts[images] = waits(evaluate_batch, loaded, pixels, indices=list(range(images)), labels=torch.arange(images),
                               methods=["rollout", "legrad"], settings=settings)
    assert counts[2] == counts[6] <= 3 + 12, counts


@pytest.mark.parametrize("method", ["atp", "ig"])
@pytest.mark.parametrize("family", ["vit", "resnet"])
def test_a_circuit_waits_a_fixed_number_of_times_whatever_its_nodes_and_sites(family, method):
    """Two sites with a circuit reaching F 0.1 drawn with at most 2 concepts each, against three reaching F 1 with up
    to 12 (more nodes, edges and passes), each kept to be pruned again (every size up to twice its own) and with every
    size kept: at most five reads of the device (m on the photo; every site's effects, activations and error at once;
    the prefixes on the grid; every size below the grid's first that reaches the target, where there is one; then at
    once the sizes kept beyond, every held node's maps and edges and the completeness and patching forward) and four
    conversions of what came back, none per node, edge, size or site; integrated gradients' passes and their edges
    along the path add none. Pruning it again on the host, at any size, waits for nothing."""
    from tiny_models import tiny as tiny_of_family, tiny_sites
    from vitviz.circuits import Metric, circuit
    from vitviz.circuits.adjacency import resized

    model = tiny_of_family(family)
    counts, sizes = {}, {}
    for blocks, most, faithful in (([1, -1], 2, 0.1), ([0, 1, -1], 12, 1.0)):
        loaded, pixels, sites = tiny_sites(model, blocks=blocks)
        for every in (False, True):
            with counting() as calls:
                graph = circuit(loaded, pixels, sites, Metric(2), most=most, faithful=faithful, method=method, steps=4,
                                every=every)
            counts[len(blocks), every] = sum(calls.values())
            sizes[len(blocks), every] = {**graph.size, "ranked": graph.faithfulness["ranked_nodes"],
                                         "held": graph.adjacency.held}
            with counting() as again:
                pruned = [resized(graph.adjacency, nodes=k) for k in range(graph.adjacency.held + 1)]
            assert not again and pruned[-1].size["nodes"] >= graph.size["nodes"]
    more = 5 if method == "atp" else 3   # integrated gradients rank fewer nodes of the tiny ViT's
    assert sizes[3, False]["nodes"] > sizes[2, False]["nodes"] + more, sizes
    assert sizes[3, False]["edges"] > sizes[2, False]["edges"] and sizes[3, True]["held"] == sizes[3, True]["ranked"]
    # the prefixes: the grid, then every size below its first reaching the target where there is one (a read each)
    assert all(7 <= count <= 9 for count in counts.values()), (counts, sizes)
    assert all(counts[k, True] == counts[k, False] for k in (2, 3)), counts


@pytest.mark.parametrize("place", [False, True])
def test_a_circuit_per_position_waits_a_fixed_number_of_times_whatever_its_nodes_and_sites(place):
    """Nodes per position (`circuits.positions`), two sites reaching F 0.1 against three reaching F 1 (more nodes,
    edges and passes; with `place`, the nodes at one cell): m on the photo, every site's effects per cell at once,
    the prefixes on the grid and below it, then at once every edge and the completeness forward; none per node,
    edge, cell, size or site."""
    from tiny_models import tiny as tiny_of_family, tiny_sites
    from vitviz.circuits import Metric
    from vitviz.circuits.positions import position_circuit

    model = tiny_of_family("swin")
    counts, sizes = {}, {}
    for blocks, faithful in (([1, -1], 0.1), ([0, 1, -1], 1.0)):
        loaded, pixels, sites = tiny_sites(model, blocks=blocks)
        at = [site.grid[1] + 1 for site in sites] if place else None
        with counting() as calls:
            graph = position_circuit(loaded, pixels, sites, Metric(2), faithful=faithful, place=at)
        counts[len(blocks)] = sum(calls.values())
        sizes[len(blocks)] = graph.size
    assert sizes[3]["nodes"] > sizes[2]["nodes"], sizes
    # the prefixes: the grid, then every size below its first reaching the target where there is one (a read each)
    assert all(6 <= count <= 9 for count in counts.values()), (counts, sizes)


def test_a_class_circuit_waits_the_same_whatever_its_number_of_images():
    """Over 2 images or 5: three reads of the device in all (the summed effects, every image's m at every size, the
    summed edges), none per image."""
    from types import SimpleNamespace

    from tiny_models import tiny as tiny_of_family, tiny_sites
    from vitviz.circuits.classes import class_circuit

    loaded, pixels, sites = tiny_sites(tiny_of_family("vit"), blocks=[0, -1])
    photos = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    loaded.preprocess = lambda image: image
    data = SimpleNamespace(image=lambda i: photos[i:i + 1])

    def sites_for(trace, image):   # one size of image, one set of sites (as `data_class_circuit` keeps them)
        return sites

    counts = {}
    for images in (2, 5):
        with counting() as calls:
            graph = class_circuit(loaded, data, sites_for, target=2, indices=list(range(images)), progress=False)
        counts[images] = sum(calls.values())
        assert graph.faithfulness["images"] == images
    assert counts[2] == counts[5] == 6, counts   # 3 reads and the 3 conversions of what came back
