"""Feature pictures (`vitviz.looks`): MACO holds the image's spectrum to the natural template and trains only the
phase; the objective rises for every family and target kind; a planted linear filter is recovered; a seed gives one
picture whatever else is drawn beside it; the shipped pictures are what the script makes; the MLPs' hidden units
the trace keeps are the ones the blocks computed; every bad input is refused in words."""
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from tests.tiny_models import FAMILIES, tiny
from vitviz import catalog, hub
from vitviz.concepts import Origin, TopK
from vitviz.concepts.files.own import checksum
from vitviz.hub.loaded import LoadedModel, Source
from vitviz.looks import Channel, Concept, Label, LooksError, Pixels, Settings, Unit, draw, natural
from vitviz.looks.images import Phase, Randomness
from vitviz.looks.pictures import FILE, SETTINGS, SHARED, jpegs, pictures_of, settings_record
from vitviz.preprocess import Transform

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[1]
QUICK = Settings(steps=16, copies=2)


def loaded_tiny(family: str, *, model: nn.Module | None = None) -> LoadedModel:
    """A tiny random model of `family` as `hub.load` hands models back (32 px, five classes)."""
    return LoadedModel(name=f"tiny-{family}", model=model or tiny(family), family=family,
                       labels=("a", "b", "c", "d", "e"), transform=Transform(crop=(32, 32), resize=32,
                                                                             mean=(0.5,) * 3, std=(0.25,) * 3),
                       source=Source(kind="folder", location="-", layout="vitviz", weights="-"))


def tiny_dictionary(loaded: LoadedModel, block: int = -1, seed: int = 0) -> TopK:
    """A TopK dictionary of random directions over `block`'s grid tokens, normalised on a few random images."""
    from vitviz.concepts.activations.cache import block_index, block_tokens, default_tokens

    with torch.no_grad():
        trace = loaded.model.trace(torch.randn(4, 3, 32, 32), attention=False)
        index = block_index(trace, block)
        tokens = block_tokens(trace, index, default_tokens(trace.blocks[index])).flatten(0, 1)
    d = tokens.shape[-1]
    dictionary = TopK(d, 4 * d, k=4, origin=Origin(model=loaded.name, block=index))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, 4 * d, generator=generator) / d ** 0.5)
        dictionary.W_dec.copy_(dictionary.W_enc.T / dictionary.W_enc.T.norm(dim=1, keepdim=True))
    dictionary.normalisation.fit(tokens)
    return dictionary.eval()


def spectrum_ratio(y: torch.Tensor, template: torch.Tensor) -> torch.Tensor:
    """|rfft2(y)| / template on the columns irfft2 leaves alone (not the real-valued first and last)."""
    return (torch.fft.rfft2(y).abs() / template)[..., 1:-1]


@pytest.mark.parametrize("side", [32, 64, 128])
def test_maco_image_spectrum_is_the_template_and_only_the_phase_trains(side):
    template = natural.magnitude(side)
    image = Phase(Randomness([0, 1], seed=3, device=torch.device("cpu")).draw("normal", (3, side, side // 2 + 1)),
                  template, natural.colour_matrix())
    assert [name for name, p in image.named_parameters() if p.requires_grad] == ["phase"]
    optimiser = torch.optim.NAdam(image.parameters(), lr=1.0)
    target = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(0))
    for _ in range(5):   # any objective: the magnitude cannot move
        optimiser.zero_grad()
        (image() * target).sum().neg().backward()
        optimiser.step()
    ratio = spectrum_ratio(image.decorrelated().detach(), template)
    # one scale per picture (the standardisation), the same at every frequency and colour
    assert torch.allclose(ratio, ratio.flatten(1).median(1).values[:, None, None, None], rtol=1e-3)
    canvas = image().detach()
    assert canvas.shape == (2, 3, side, side) and 0 <= canvas.min() and canvas.max() <= 1


def test_template_resampled_keeps_its_values_at_the_frequencies_it_has():
    template = natural.shipped()["magnitude"]
    assert torch.equal(natural.magnitude(template.shape[1]), template)
    half = natural.magnitude(64)   # in cycles per pixel, frequency k of a 64 px canvas is the template's 2k of 128
    assert torch.allclose(half, template[:, ::2, ::2], rtol=1e-4, atol=1e-5)


def test_natural_statistics_are_what_the_script_measures():
    sys.path.insert(0, str(ROOT / "assets"))
    try:
        import make_spectrum
    finally:
        sys.path.pop(0)
    measured = natural.measure(make_spectrum.photos(), crops=4)   # the first 4 crops of each photo alone
    assert torch.allclose(measured["colour"], natural.colour_matrix(), atol=1e-6)   # every pixel: the same numbers
    shipped = natural.magnitude(natural.SIZE)
    # 64 crops a photo make the shipped mean; 4 of them are a noisy estimate of it, within a fifth on average
    assert ((measured["magnitude"] - shipped).abs()[:, 1:, 1:].mean() / shipped[:, 1:, 1:].mean()) < 0.2
    colours = natural.colour_matrix()
    assert torch.allclose(colours.norm(dim=0).max(), torch.tensor(1.0))


def targets_for(loaded: LoadedModel) -> list:
    targets = [Concept(tiny_dictionary(loaded), 3), Channel(-1, 2), Label("c"), Concept(tiny_dictionary(loaded), 5,
                                                                                         position=0)]
    return targets + ([] if loaded.family == "resnet" else [Unit(0, 4)])


@pytest.mark.parametrize("family", FAMILIES)
def test_objective_rises_for_every_family_and_target_kind(family):
    loaded = loaded_tiny(family)
    drawing = draw(loaded, targets_for(loaded), settings=Settings(steps=24, copies=2), bar=False)
    start, end = drawing.curve[:, :3].mean(1), drawing.curve[:, -3:].mean(1)
    assert (end > start).all(), (start, end)
    assert drawing.images.shape[1:] == (64, 64, 3) and drawing.alpha.shape[1:] == (64, 64)
    assert np.isclose(drawing.alpha.reshape(len(drawing.alpha), -1).max(1), 1).all()


def test_pixels_objective_rises():
    loaded = loaded_tiny("vit")
    drawing = draw(loaded, [Channel(-1, 2), Unit(1, 7)], settings=Settings(method="pixels", steps=24, copies=4),
                   bar=False)
    assert (drawing.curve[:, -4:].mean(1) > drawing.curve[:, :4].mean(1)).all()
    assert drawing.images.shape == (2, 32, 32, 3) and 0 <= drawing.images.min() and drawing.images.max() <= 1


def test_planted_linear_filter_is_recovered():
    """A ViT whose first block passes its tokens on unchanged: channel c of its output, averaged over the grid, is
    the linear filter w_c of the patch embedding applied to every 8 x 8 patch; maximised, every patch of the
    picture is that filter's pattern (the sign of w_c, under the [0, 1] bounds)."""
    model = tiny("vit")
    with torch.no_grad():
        for name, parameter in model.blocks[0].named_parameters():
            if not name.startswith("norm"):
                parameter.zero_()   # no attention, no MLP: the block's output is its input
    loaded = loaded_tiny("vit", model=model)
    plain = Pixels(jitter=0.0, scale=(1.0, 1.0), colour=0.0, shift=0.0, tv=0.0)
    drawing = draw(loaded, [Channel(0, c) for c in range(4)], settings=Settings(method=plain, steps=40, copies=1),
                   bar=False)
    filters = model.patch_embed.proj.weight[:4].detach()   # 4 3 8 8, on normalised pixels: the same sign on [0, 1]
    for picture, w in zip(drawing.images, filters):
        patches = torch.from_numpy(picture).permute(2, 0, 1).unfold(1, 8, 8).unfold(2, 8, 8).mean((1, 2))   # 3 8 8
        found = np.corrcoef(patches.flatten().numpy(), w.flatten().numpy())[0, 1]
        assert found > 0.7, found


def test_same_seed_same_picture_whatever_is_drawn_beside_it():
    loaded = loaded_tiny("cvt")
    dictionary = tiny_dictionary(loaded)
    first = draw(loaded, [Concept(dictionary, c) for c in (1, 2, 3)], settings=QUICK, bar=False)
    again = draw(loaded, [Concept(dictionary, c) for c in (1, 2, 3)], settings=QUICK, bar=False)
    alone = draw(loaded, [Concept(dictionary, 2)], settings=QUICK, bar=False)
    other = draw(loaded, [Concept(dictionary, 2)], settings=Settings(steps=16, copies=2, seed=1), bar=False)
    assert np.array_equal(first.images, again.images) and np.array_equal(first.curve, again.curve)
    assert np.abs(first.images[1] - alone.images[0]).max() < 1e-3   # a batch's sums may round differently
    assert np.abs(other.images[0] - alone.images[0]).mean() > 0.05


def test_across_models_draws_one_picture_for_all():
    loaded = [loaded_tiny(f) for f in ("vit", "swin")]
    drawing = draw(loaded, Label("b"), settings=QUICK, bar=False)
    assert drawing.models == ("tiny-vit", "tiny-swin") and drawing.images.shape == (1, 64, 64, 3)
    assert drawing.curve[0, -3:].mean() > drawing.curve[0, :3].mean()


@pytest.mark.parametrize("family", ["vit", "cvt", "swin", "convnext"])
def test_trace_units_are_the_hidden_units_the_blocks_computed(family):
    model = tiny(family)
    seen = []
    acts = [m.mlp.act for m in model.modules() if hasattr(m, "mlp")]
    handles = [act.register_forward_hook(lambda _, __, out: seen.append(out)) for act in acts]
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        trace = model.trace(pixels, units=True)
        for handle in handles:
            handle.remove()
        without = model.trace(pixels)
        plain = model(pixels)
    assert len(trace.blocks) == len(seen)
    for block, hooked in zip(trace.blocks, seen):
        assert torch.equal(block.hidden, hooked.flatten(1, 2) if hooked.dim() == 4 else hooked)
    assert all(b.hidden is None for b in without.blocks)   # kept only when asked, and nothing else changes:
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(trace.blocks, without.blocks))
    assert torch.equal(trace.logits, without.logits) and torch.allclose(trace.logits, plain, atol=1e-5)


def test_bad_targets_are_refused_in_words():
    vit, resnet = loaded_tiny("vit"), loaded_tiny("resnet")
    dictionary = tiny_dictionary(vit)
    cases = [
        (vit, Unit(0, 999), "no unit 999"),
        (vit, Unit(7, 0), "there is no block 7"),
        (vit, Channel(0, 16), "no channel 16"),
        (vit, Concept(dictionary, 64), "no concept 64"),
        (vit, Concept(dictionary, 1, position=16), "no position 16"),
        (vit, Label("zebra"), "no class 'zebra'"),
        (resnet, Unit(0, 1), "no MLP"),
        (resnet, Concept(dictionary, 1), "not on tiny-resnet"),
    ]
    for loaded, target, words in cases:
        with pytest.raises(LooksError, match=words):
            draw(loaded, target, settings=QUICK, bar=False)
    with pytest.raises(LooksError, match="no method 'deepdream'"):
        Settings(method="deepdream")
    with pytest.raises(LooksError, match="steps must be"):
        Settings(steps=0)


def test_command_writes_each_picture_with_its_map_and_curve(tmp_path, capsys):
    from vitviz.cli import main

    assert main(["looks", "--concepts", "vit-cifar10-last", "--ids", "394", "7", "--steps", "3", "--copies", "1",
                 "--out", str(tmp_path), "--device", "cpu"]) == 0
    for stem in ("concept-0394", "concept-0007"):
        image = np.asarray(Image.open(tmp_path / f"{stem}.png"))
        assert image.shape == (64, 64, 3) and np.asarray(Image.open(tmp_path / f"{stem}-alpha.png")).shape == (64, 64)
        record = json.loads((tmp_path / f"{stem}-curve.json").read_text())
        assert record["models"] == ["vit-cifar10"] and len(record["objective"]) == 3
    for argv, words in [
        (["--concepts", "vit-cifar10-last", "--ids", "768"], "no concept 768"),
        (["--model", "vit-cifar10", "--unit", "9:1"], "no block 9"),
        (["--model", "vit-cifar10", "--unit", "3"], "BLOCK:UNIT"),
        (["--model", "resnet-cifar10", "--unit", "2:1"], "no MLP"),
        (["--model", "cvt-cifar10", "--concepts", "vit-cifar10-last", "--ids", "1"], "not on cvt-cifar10"),
        (["--model", "vit-cifar10", "--class", "zebra"], "no class 'zebra'"),
        (["--unit", "1:1"], "--model M"),
    ]:
        assert main(["looks", *argv, "--steps", "1", "--out", str(tmp_path), "--device", "cpu"]) == 2
        assert words in capsys.readouterr().err


BUNDLED_PAIR = ("vit-cifar10-last", "cvt-cifar10-last")


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=() if n in (*BUNDLED_PAIR, "across-cifar10") else pytest.mark.slow)   # the rest: ~8 s each
    for n, entry in catalog.BUNDLED_DICTIONARIES.items() if n in BUNDLED_PAIR or (entry.path / FILE).exists()])
def test_shipped_pictures_are_what_the_script_makes(name):
    from vitviz.concepts import load

    pictures = pictures_of(name)
    assert pictures is not None, f"{name} has no pictures: checkpoints/concepts/looks.sh draws them"
    dictionary = load(name)
    assert pictures.settings == json.loads(json.dumps(settings_record(SETTINGS)))
    assert pictures.n_concepts == dictionary.n_concepts
    per_model = dictionary.dictionaries if hasattr(dictionary, "dictionaries") else {dictionary.model: dictionary}
    assert pictures.models == tuple(per_model)
    assert pictures.dictionary_sha256 == checksum({k: v for k, v in dictionary.state_dict().items()})
    # the first model's own set, a concept at each end: the drawing is the one the script runs
    own = pictures.models[0]
    concepts = (0, dictionary.n_concepts - 1)
    drawing = draw(hub.load(own, device="cpu"), [Concept(name, c) for c in concepts], settings=SETTINGS,
                   device="cpu", bar=False)
    encoded = jpegs(drawing.images, drawing.alpha)
    decode = lambda data: np.asarray(Image.open(io.BytesIO(data))).astype(np.int16)
    for i, concept in enumerate(concepts):
        image, alpha = pictures.picture(concept, own)
        # Redrawn with other kernels the last bits differ, and the optimisation amplifies them where it is chaotic.
        # Measured on every bundled dictionary's concepts at both ends, drawn with ATen's and MKL's kernels held to
        # plain C++ and SSE4.2 (ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2) against the shipped AVX2
        # drawing: the curves' first 4 steps agree to 2.4e-6 everywhere; the ViTs', CvTs' and across pictures end
        # within 0.7 grey levels on average, but the Swin's and the ResNet's curves part after 5 to 21 steps and
        # their pictures end up to 15.8 levels apart on average (objectives up to 12 % apart). So the start is
        # checked tightly (a wrong canvas, model, concept column, token order or seed moves it) and the end loosely:
        # another seed moves a picture by 32-36 levels on average, one copy instead of two by 27-41. The transparency
        # map sums the same noisy gradients and moves more (21 levels on the ResNet's concept 511): its shape only.
        assert np.allclose(pictures.curve(concept, own)[:4], drawing.curve[i, :4], atol=1e-5)
        assert drawing.curve[i, -1] == pytest.approx(pictures.curve(concept, own)[-1], rel=0.2)
        assert np.abs(decode(encoded[2 * i]) - image).mean() < 20, concept
        assert decode(encoded[2 * i + 1]).shape == alpha.shape
    if SHARED not in pictures.sets:
        return
    # the shared set, its first concept drawn in every model at once. There a batch of 64 and one of 1 round their
    # last bits apart and four models' gradients amplify them: measured on across-cifar10, the curves part after 5
    # to 12 steps and the pictures end 9 to 13 grey levels apart on average, the objectives within 10 %. So its
    # start is checked (the same canvas, models, normalisation and seed: the curve to 1e-4 for 4 steps), and its end
    drawing = draw([hub.load(m, device="cpu") for m in pictures.models], Concept(name, 0), settings=SETTINGS,
                   device="cpu", bar=False)
    shipped = pictures.curve(0, SHARED)
    assert np.allclose(shipped[:4], drawing.curve[0, :4], atol=1e-4)
    assert drawing.curve[0, -1] == pytest.approx(shipped[-1], rel=0.15)
    assert np.abs(drawing.images[0] * 255 - pictures.picture(0, SHARED)[0]).mean() < 20
