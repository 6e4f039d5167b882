"""Activations from the trace for every family, their cache, and the alignment of two models' grids."""
import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from vitviz import hub
from vitviz.concepts import ConceptsError, load
from vitviz.concepts.activations.align import align, in_photo, token_rectangles
from vitviz.concepts.activations.cache import block_tokens, cache_activations, cache_blocks
from vitviz.concepts.build import alignment_of, cache_layers
from vitviz.data import Dataset, open_folder
from vitviz.preprocess import Transform

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def photos(n: int, size: int = 32, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]


def in_memory(images: list, name: str = "photos") -> Dataset:
    return Dataset(name=name, ids=tuple(f"{name}/{i}" for i in range(len(images))), labels=None, classes=None,
                   source=images.__getitem__)


@pytest.fixture(scope="module")
def vit():
    return hub.load("vit-cifar10")


@pytest.fixture(scope="module")
def cvt():
    return hub.load("cvt-cifar10")


def test_block_tokens_pick_patches_class_token_or_positions(vit):
    images = photos(2)
    trace = vit.model.trace(torch.cat([vit.preprocess(i) for i in images]), attention=False)
    out = trace.blocks[-1].tokens
    assert torch.equal(block_tokens(trace, -1, "patch"), out[:, 1:])
    assert torch.equal(block_tokens(trace, -1, "cls"), out[:, :1])
    assert torch.equal(block_tokens(trace, 6, "patch+cls"), out)
    with pytest.raises(ConceptsError, match="no block 7"):
        block_tokens(trace, 7, "patch")
    with pytest.raises(ConceptsError, match="transformer block"):
        block_tokens(trace, -1, "position")
    resnet = hub.load("resnet-cifar10")
    cnn = resnet.model.trace(resnet.preprocess(images[0]), attention=False)
    assert torch.equal(block_tokens(cnn, -1, "position"), cnn.blocks[-1].tokens)
    with pytest.raises(ConceptsError, match="convolutional block"):
        block_tokens(cnn, -1, "patch")


def test_registers_are_left_out(dinov2_repos):
    loaded = hub.load("dinov2-s14-reg4", size=56)
    trace = loaded.model.trace(loaded.preprocess(photos(1, 56)[0]), attention=False)
    block = trace.blocks[-1]
    assert block.prefix_kinds == ("cls", "reg", "reg", "reg", "reg")
    assert torch.equal(block_tokens(trace, -1, "patch"), block.tokens[:, 5:])
    assert torch.equal(block_tokens(trace, -1, "patch+cls"), torch.cat([block.tokens[:, :1], block.tokens[:, 5:]], 1))


def test_the_cache_is_made_once_keyed_by_layer_and_resumes(vit, tmp_path, monkeypatch):
    data = in_memory(photos(5))
    first = cache_activations(vit, data, block=-1, root=tmp_path, progress=False, batch_size=2)
    reference = vit.model.trace(torch.cat([vit.preprocess(data.image(i)) for i in range(5)]), attention=False)
    torch.testing.assert_close(first.tokens(), reference.blocks[-1].tokens[:, 1:].reshape(-1, 192), atol=1e-5,
                               rtol=1e-5)
    assert first.layer["block"] == 6 and first.layer["grid"] == [8, 8] and len(first.layer["rectangles"]) == 64

    forwards = []
    real = vit.model.trace
    monkeypatch.setattr(vit.model, "trace", lambda *a, **k: forwards.append(a[0].shape[0]) or real(*a, **k))
    again = cache_activations(vit, data, block=-1, root=tmp_path, progress=False)
    assert forwards == [1] and torch.equal(again.tokens(), first.tokens())   # the probe only: read from disk
    other = cache_activations(vit, data, block=3, root=tmp_path, progress=False)
    assert other.folder != first.folder and other.layer["block"] == 3
    assert cache_activations(vit.at_size(48), data, block=-1, root=tmp_path, progress=False).folder != first.folder

    shards = sorted(first.folder.glob("shard-*"))
    monkeypatch.setattr("vitviz.concepts.activations.cache.SHARD_IMAGES", 2)
    split = cache_activations(vit, data, block=-1, root=tmp_path / "small", progress=False)
    assert len(split.shards) == 3 and len(shards) == 1
    split.shards[1].unlink()   # an interrupted run: one shard never written
    forwards.clear()
    resumed = cache_activations(vit, data, block=-1, root=tmp_path / "small", progress=False)
    assert forwards == [1, 2] and torch.equal(resumed.tokens(), first.tokens())


def test_several_blocks_are_cached_from_one_pass_as_each_alone(cvt, tmp_path, monkeypatch):
    """`cache_blocks` traces each image once for every block asked, and each layer's folder is the one caching that
    block alone makes, tensor for tensor; a block whose cache exists already costs no trace."""
    data = in_memory(photos(5))
    forwards = []
    real = cvt.model.trace
    monkeypatch.setattr(cvt.model, "trace", lambda *a, **k: forwards.append(a[0].shape[0]) or real(*a, **k))
    both = cache_blocks(cvt, data, blocks=[1, -1], tokens=[None, "patch+cls"], root=tmp_path / "both", batch_size=2,
                        progress=False)
    assert forwards == [1, 2, 2, 1]   # the probe, then each run of images once
    alone = [cache_activations(cvt, data, block=1, root=tmp_path / "alone", batch_size=2, progress=False),
             cache_activations(cvt, data, block=-1, tokens="patch+cls", root=tmp_path / "alone", batch_size=2,
                               progress=False)]
    for layer, single in zip(both, alone):
        assert layer.folder.name == single.folder.name and layer.layer == single.layer
        for mine, its in zip(layer.shards, single.shards):
            ours, theirs = load_file(mine), load_file(its)
            assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert [layer.layer["tokens"] for layer in both] == ["patch", "patch+cls"] and both[1].layer["block"] == 8
    forwards.clear()
    cache_blocks(cvt, data, blocks=[1, -1, 3], tokens=[None, "patch+cls", None], root=tmp_path / "both",
                 batch_size=2, progress=False)
    assert forwards == [1, 2, 2, 1]   # block 3 was missing: one pass, which rewrites the others' same shards
    forwards.clear()
    cache_blocks(cvt, data, blocks=[1, 3], tokens=[None, None], root=tmp_path / "both", progress=False)
    assert forwards == [1]
    with pytest.raises(ConceptsError, match="one token kind for each block"):
        cache_blocks(cvt, data, blocks=[1, 3], tokens=[None], root=tmp_path, progress=False)
    with pytest.raises(ConceptsError, match="asked for twice"):
        cache_blocks(cvt, data, blocks=[8, -1], tokens=[None, None], root=tmp_path, progress=False)


def test_unreadable_images_are_skipped_and_counted(vit, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, image in enumerate(photos(3)):
        image.save(folder / f"{i}.png")
    (folder / "broken.jpg").write_bytes(b"not an image at all")
    cached = cache_activations(vit, open_folder(folder), block=-1, root=tmp_path / "cache", progress=False)
    assert cached.skipped == 1 and cached.tokens().shape == (3 * 64, 192)
    _, images, sizes = cached.grids()
    assert images.tolist() == [0, 1, 2] and sizes.tolist() == [[32, 32]] * 3


def test_the_pipelined_cache_writes_the_shards_a_plain_loop_writes_bit_for_bit(vit, tmp_path, monkeypatch):
    """DataLoader workers, the background writer and the shards' runs give the same files as decoding,
    tracing and saving image run by image run in one thread (the reference, written out here)."""
    from safetensors.torch import load as load_tensors

    images = photos(7)
    broken = 3
    data = Dataset(name="photos with a broken one", ids=tuple(map(str, range(7))), labels=None, classes=None,
                   source=lambda i: b"not an image at all" if i == broken else images[i])
    monkeypatch.setattr("vitviz.concepts.activations.cache.SHARD_IMAGES", 4)
    shards = {workers: [load_tensors(shard.read_bytes()) for shard in cache_activations(
        vit, data, block=-1, root=tmp_path / f"workers-{workers}", progress=False, batch_size=3,
        workers=workers).shards] for workers in (0, 2)}
    for plain, piped in zip(*shards.values(), strict=True):
        assert plain.keys() == piped.keys() and all(torch.equal(plain[k], piped[k]) for k in plain)
    for shard, chunk in zip(shards[2], ([0, 1, 2, 3], [4, 5, 6]), strict=True):   # the loop before the pipeline
        rows, kept = [], []
        for start in range(0, len(chunk), 3):
            run = [i for i in chunk[start:start + 3] if i != broken]
            if not run:   # [3]: a run with nothing that decodes
                continue
            with torch.inference_mode():
                trace = vit.model.trace(torch.cat([vit.preprocess(images[i]) for i in run]), attention=False)
            rows.append(block_tokens(trace, -1, "patch").float())
            kept += run
        assert torch.equal(shard["tokens"], torch.cat(rows)) and shard["images"].tolist() == kept


def test_a_damaged_shard_is_refused_in_words(vit, tmp_path):
    cached = cache_activations(vit, in_memory(photos(2)), block=-1, root=tmp_path, progress=False)
    cached.shards[0].write_bytes(cached.shards[0].read_bytes()[:100])
    with pytest.raises(ConceptsError, match="damaged.*delete the folder"):
        cached.tokens()


def test_token_rectangles_tile_the_input(vit, cvt):
    for loaded in (vit, cvt):
        trace = loaded.model.trace(loaded.preprocess(photos(1)[0]), attention=False)
        rects = token_rectangles(trace, len(trace.blocks) - 1)
        side = 32 // trace.blocks[-1].query_grid[0]
        assert rects[0].tolist() == [0, 0, side, side] and rects[-1].tolist() == [32 - side, 32 - side, 32, 32]
        area = ((rects[:, 2] - rects[:, 0]) * (rects[:, 3] - rects[:, 1])).sum()
        assert area == 32 * 32


def test_aligning_an_8x8_grid_with_a_4x4_one_averages_each_2x2_square(vit, cvt, tmp_path):
    data = in_memory(photos(3))
    layers = cache_layers([vit, cvt], data, blocks=[-1, -1], tokens=None, root=tmp_path, indices=None,
                          progress=False)
    assert layers.alignment.grid == (4, 4)
    rows_vit, rows_cvt = layers.rows()
    grids_vit, _, _ = layers.cached[0].grids()
    grids_cvt, _, _ = layers.cached[1].grids()
    square = F.avg_pool2d(grids_vit.reshape(3, 8, 8, 192).permute(0, 3, 1, 2), 2)   # the reference: 2 x 2 means
    torch.testing.assert_close(rows_vit, square.permute(0, 2, 3, 1).reshape(-1, 192), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rows_cvt, grids_cvt.reshape(-1, 192))   # the CvT's own 4 x 4 (patch: no class token)


def test_area_weights_by_hand_and_the_region_both_crops_saw():
    # a 3 x 3 grid of a 3-px input against a 2 x 2 grid of the same input: cell (0, 0) is [0, 1.5)^2
    three = torch.tensor([[i, j, i + 1, j + 1] for i in range(3) for j in range(3)], dtype=torch.float64) / 3
    two = torch.tensor([[i, j, i + 1, j + 1] for i in range(2) for j in range(2)], dtype=torch.float64) / 2
    alignment = align([three, two])
    assert alignment.grid == (2, 2)
    expected = torch.tensor([1, 0.5, 0, 0.5, 0.25, 0, 0, 0, 0]) / 2.25   # areas of [0,1.5)^2 over the 3 x 3 tiles
    torch.testing.assert_close(alignment.weights[0][0], expected)
    torch.testing.assert_close(alignment.weights[1], torch.eye(4))

    # a model that resizes the 64 x 96 photo to 32 x 48 and crops 32 x 32 saw its middle third of the width only
    wide = Transform(crop=(32, 32), resize=32, mean=(0, 0, 0), std=(1, 1, 1))
    whole = Transform(crop=(64, 96), resize=(64, 96), mean=(0, 0, 0), std=(1, 1, 1))
    cropped = in_photo(torch.tensor([[0.0, 0, 32, 32]], dtype=torch.float64), wide, (64, 96))
    torch.testing.assert_close(cropped, torch.tensor([[0, 1 / 6, 1, 5 / 6]], dtype=torch.float64))
    tiles = torch.tensor([[i * 16, j * 16, i * 16 + 16, j * 16 + 16] for i in range(4) for j in range(6)],
                         dtype=torch.float64)
    region = align([in_photo(tiles, whole, (64, 96)), cropped]).region
    assert region == pytest.approx((0, 1 / 6, 1, 5 / 6))


def test_grids_that_do_not_overlap_are_refused():
    left = torch.tensor([[0.0, 0.0, 1.0, 0.4]], dtype=torch.float64)
    right = torch.tensor([[0.0, 0.6, 1.0, 1.0]], dtype=torch.float64)
    with pytest.raises(ConceptsError, match="do not overlap"):
        align([left, right])
    with pytest.raises(ConceptsError, match="class token alone"):
        align([left, left[:0]])


def test_aligning_needs_photos_of_one_size(vit, cvt, tmp_path):
    data = in_memory([*photos(2), *photos(1, size=40)])
    with pytest.raises(ConceptsError, match="differ in size"):
        cache_layers([vit, cvt], data, blocks=[-1, -1], tokens=None, root=tmp_path, indices=None, progress=False)
    assert alignment_of([vit, cvt], [cache_activations(m, in_memory(photos(1)), block=-1, root=tmp_path,
                                                        progress=False) for m in (vit, cvt)], (32, 32)).grid == (4, 4)


def test_the_train_command_writes_a_dictionary_that_knows_its_layer(tmp_path):
    from vitviz.cli import main

    folder = tmp_path / "photos"
    folder.mkdir()
    for i, image in enumerate(photos(40)):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        (folder / f"{i:02d}.png").write_bytes(buffer.getvalue())
    out = tmp_path / "dictionary"
    code = main(["concepts", "train", "--models", "vit-cifar10", "--block", "-2", "--data", str(folder), "--k", "4",
                 "--expansion", "2", "--batch-size", "512", "--steps", "8", "--cache", str(tmp_path / "cache"),
                 "--out", str(out)])
    assert code == 0
    dictionary = load(out)
    assert (dictionary.model, dictionary.block, dictionary.origin.tokens) == ("vit-cifar10", 5, "patch")
    assert dictionary.n_concepts == 384 and dictionary.k == 4
    summary = json.loads((out / "training.json").read_text())
    assert summary["tokens_trained_on"] == [40 * 64] and summary["grid"] == [8, 8]
    assert summary["training"]["steps"] == 8 and summary["training"]["epochs"] == 1.6   # 5 steps a pass
    assert summary["training"]["warmup"] == 1 and summary["training"]["fvu"] > 0
    assert main(["concepts", "train", "--models", "vit-cifar10", "--block", "9", "--data", str(folder),
                 "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 2

    depths = tmp_path / "depths"
    common = ["--data", str(folder), "--k", "4", "--expansion", "2", "--batch-size", "512", "--steps", "3", "--cache",
              str(tmp_path / "cache"), "--out", str(depths)]
    assert main(["concepts", "train", "--models", "cvt-cifar10", "--block", "1", "-1", "--tokens", "patch",
                 "patch+cls", *common]) == 0
    first, last = load(depths / "block1"), load(depths / "block8")   # one dictionary per block
    assert (first.block, first.origin.tokens, last.block, last.origin.tokens) == (1, "patch", 8, "patch+cls")
    assert main(["concepts", "train", "--models", "cvt-cifar10", "--block", "1", "3", "--tokens", "patch", "patch",
                 "patch", *common]) == 2   # three kinds for two blocks
    assert main(["concepts", "train", "--models", "cvt-cifar10", "--block", "1", "1", *common]) == 2

@pytest.mark.slow
def test_caching_and_training_under_torchrun_equal_one_process(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import concepts_cache_ranks as script
    from vitviz.concepts.activations import cache as activations
    from vitviz.concepts.build import train_layers

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(Path(script.__file__)), str(tmp_path / "ranks")], cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setattr(activations, "SHARD_IMAGES", script.SHARD_IMAGES)
    model = hub.load("vit-cifar10")
    layers = cache_layers([model], script.images(), blocks=[-1], tokens=None, root=tmp_path / "one" / "cache",
                          indices=None, progress=False)
    ranked = cache_layers([model], script.images(), blocks=[-1], tokens=None, root=tmp_path / "ranks" / "cache",
                          indices=None, progress=False)
    assert len(ranked.cached[0].shards) == 3
    torch.testing.assert_close(ranked.rows()[0], layers.rows()[0], atol=1e-5, rtol=1e-5)
    one = train_layers([model], layers, out=tmp_path / "one" / "dictionary", progress=False, **script.SETTINGS)
    two = load(tmp_path / "ranks" / "dictionary")
    for name, value in one.state_dict().items():
        torch.testing.assert_close(two.state_dict()[name], value, atol=1e-5, rtol=0)
