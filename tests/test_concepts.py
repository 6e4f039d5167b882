"""vitviz.concepts: dictionaries (standard, TopK, BatchTopK), their file, training and metrics.

References are built independently: planted dictionaries with known atoms, Overcomplete's encoders on
the same weights, SAELens's threshold update and Gao et al.'s AuxK written out, metrics worked by hand.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import pickle
import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.optimize import linear_sum_assignment

from interrupting import Interrupting
from vitviz import concepts
from vitviz.concepts import BatchTopK, ConceptsError, Origin, Standard, TopK
from vitviz.concepts.train.single import auxk, remove_parallel_gradient

ORIGIN = Origin(model="vit-cifar10", revision="main", block=6, tokens="patch")


def planted(*, tokens: int, d: int, n: int, k: int, noise: float = 0.01, offset: float = 3.0, seed: int = 0):
    """(activations t d, atoms n d): each token k of n known unit-norm atoms with weights in [0.5, 1.5], plus
    Gaussian noise and a common offset. (Its generator is never seeded like training's, whose first draws are the
    decoder's rows: the atoms would be the initial dictionary.)"""
    g = torch.Generator().manual_seed(1000 + seed)
    atoms = torch.randn(n, d, generator=g)
    atoms /= atoms.norm(dim=1, keepdim=True)
    chosen = torch.rand(tokens, n, generator=g).argsort(1)[:, :k]
    codes = torch.zeros(tokens, n).scatter(1, chosen, torch.rand(tokens, k, generator=g) + 0.5)
    return codes @ atoms + noise * torch.randn(tokens, d, generator=g) + offset, atoms


def random_dictionary(cls, d=16, n=48, seed=0, **settings):
    """A dictionary with random weights, unit decoder rows and a non-trivial normalisation."""
    g = torch.Generator().manual_seed(seed)
    dictionary = cls(d, n, origin=ORIGIN, **settings)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, n, generator=g) / math.sqrt(d))
        dictionary.b_enc.copy_(0.1 * torch.randn(n, generator=g))
        rows = torch.randn(n, d, generator=g)
        dictionary.W_dec.copy_(rows / rows.norm(dim=1, keepdim=True))
        dictionary.b_dec.copy_(0.2 * torch.randn(d, generator=g))
        dictionary.normalisation.offset.copy_(torch.randn(d, generator=g))
        dictionary.normalisation.scale.fill_(2.5)
    return dictionary.eval()


def matched_atoms(atoms: torch.Tensor, dictionary) -> np.ndarray:
    """Each true atom's cosine with the decoder row a one-to-one (Hungarian) assignment gives it."""
    cosine = (atoms @ dictionary.W_dec.detach().T).numpy()
    rows, columns = linear_sum_assignment(-cosine)
    return cosine[rows, columns]


@pytest.fixture(scope="module")
def overcomplete_sae():
    """overcomplete.sae without running overcomplete/__init__.py, which imports its plotting helpers (0.3.0's
    call `matplotlib.cm.get_cmap`, removed in matplotlib 3.9); the SAEs need none of them."""
    location = importlib.util.find_spec("overcomplete").submodule_search_locations
    package = types.ModuleType("overcomplete")
    package.__path__ = list(location)
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "overcomplete"}
    sys.modules["overcomplete"] = package
    try:
        yield importlib.import_module("overcomplete.sae")
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "overcomplete"]:
            del sys.modules[name]
        sys.modules.update(saved)


# ---- training finds what was planted ---------------------------------------------------------------------

@pytest.mark.slow
def test_topk_dictionary_recovers_planted_atoms():
    x, atoms = planted(tokens=12_000, d=32, n=64, k=4)
    dictionary = concepts.train(x, kind="topk", k=4, expansion=4, epochs=4, batch_size=64, lr=3e-3, warmup=10,
                                progress=False)
    cosines = matched_atoms(atoms, dictionary)
    assert (cosines >= 0.9).mean() >= 0.9, np.sort(cosines)[:8]


@pytest.mark.slow
def test_batchtopk_dictionary_recovers_planted_atoms_and_keeps_k_at_inference():
    x, atoms = planted(tokens=12_000, d=32, n=64, k=4)
    dictionary = concepts.train(x, kind="batchtopk", k=4, expansion=4, epochs=4, batch_size=64, lr=3e-3, warmup=10,
                                progress=False)
    assert (matched_atoms(atoms, dictionary) >= 0.9).mean() >= 0.8   # BatchTopK: 84-95 % over four data seeds
    assert 3 <= concepts.metrics(dictionary, x).l0 <= 5   # the JumpReLU threshold keeps about k per token


def test_decoder_rows_stay_unit_norm_through_training():
    x, _ = planted(tokens=2048, d=16, n=24, k=3)
    for kind in ("standard", "topk", "batchtopk"):
        dictionary = concepts.train(x, kind=kind, **({} if kind == "standard" else {"k": 3}), expansion=2,
                                    batch_size=256, lr=3e-3, progress=False)
        torch.testing.assert_close(dictionary.W_dec.detach().norm(dim=1), torch.ones(32), atol=1e-5, rtol=0)


def test_standard_dictionary_is_made_sparser_by_a_larger_l1():
    x, _ = planted(tokens=4096, d=16, n=24, k=3)
    l0 = [concepts.metrics(concepts.train(x, kind="standard", l1=l1, expansion=2, epochs=4, batch_size=64, lr=3e-3,
                                          warmup=10, progress=False), x).l0 for l1 in (0.1, 3.0)]
    assert l0[1] < 0.5 * l0[0], l0   # 16.5 and 5.4 concepts per token


def test_training_shows_the_running_fvu_and_l0(capsys):
    x, _ = planted(tokens=512, d=8, n=12, k=2)
    concepts.train(x, kind="topk", k=2, expansion=2, batch_size=128)
    shown = capsys.readouterr().err
    assert "topk dictionary" in shown and "FVU=" in shown and "L0=2.0" in shown


def test_encode_and_decode_keep_the_leading_dimensions():
    dictionary = random_dictionary(TopK, k=3)
    tokens = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    codes = dictionary.encode(tokens)
    assert codes.shape == (2, 5, 48) and dictionary.decode(codes).shape == (2, 5, 16)
    torch.testing.assert_close(codes[1], dictionary.encode(tokens[1]))


def test_normalisation_is_estimated_from_the_first_tokens_training_reads_and_stored():
    x, _ = planted(tokens=1024, d=8, n=12, k=2, offset=5.0)
    dictionary = concepts.train([x[i:i + 128] for i in range(0, 1024, 128)], kind="topk", k=2, expansion=2,
                                norm_tokens=300, batch_size=128, progress=False)
    first = x[:300].double()
    torch.testing.assert_close(dictionary.normalisation.offset, first.mean(0).float())
    expected_scale = (first - first.mean(0)).square().mean().sqrt().float()
    torch.testing.assert_close(dictionary.normalisation.scale, expected_scale)


# ---- the kinds equal their references -------------------------------------------------------------------

def test_topk_and_batchtopk_keep_what_concepts_md_works_out():
    pre = torch.tensor([[3.0, 2.5, 0.0], [1.0, 0.5, 0.0]])
    assert TopK(2, 3, k=1).activation(pre).tolist() == [[3, 0, 0], [1, 0, 0]]
    assert BatchTopK(2, 3, k=1).training_activation(pre).tolist() == [[3, 2.5, 0], [0, 0, 0]]


def test_topk_encoder_and_decoder_equal_overcomplete_on_the_same_weights(overcomplete_sae):
    ours = random_dictionary(TopK, k=5).double()
    theirs = overcomplete_sae.TopKSAE(16, 48, top_k=5).double()
    with torch.no_grad():
        theirs.encoder.final_block[0].weight.copy_(ours.W_enc.T)
        theirs.encoder.final_block[0].bias.copy_(ours.b_enc)
        theirs.dictionary._weights.copy_(ours.W_dec)
    theirs.eval()
    x = torch.randn(300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 + 1
    normalised = (x - ours.normalisation.offset) / ours.normalisation.scale - ours.b_dec   # Overcomplete has no b_dec
    codes = ours.encode(x)
    torch.testing.assert_close(codes, theirs.encode(normalised)[1], atol=1e-12, rtol=0)
    assert ((codes > 0).sum(1) <= 5).all() and (codes >= 0).all()
    expected = (theirs.decode(codes) + ours.b_dec) * ours.normalisation.scale + ours.normalisation.offset
    # Overcomplete divides its rows by (norm + 1e-8) on the way into eval mode: 1e-8 of each row's part
    torch.testing.assert_close(ours.decode(codes), expected, atol=1e-6, rtol=1e-7)


def test_batchtopk_codes_equal_overcomplete_in_training_and_at_inference(overcomplete_sae):
    ours = random_dictionary(BatchTopK, k=5).double()
    x = torch.randn(200, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3 + 1
    theirs = overcomplete_sae.BatchTopKSAE(16, 48, top_k=5 * len(x)).double()   # top_k counts the whole batch
    with torch.no_grad():
        theirs.encoder.final_block[0].weight.copy_(ours.W_enc.T)
        theirs.encoder.final_block[0].bias.copy_(ours.b_enc)
    normalised = (x - ours.normalisation.offset) / ours.normalisation.scale - ours.b_dec
    pre = ours.pre_activations(ours.normalisation(x))
    theirs.train()
    training_codes = ours.training_activation(pre)
    torch.testing.assert_close(training_codes, theirs.encode(normalised)[1], atol=1e-12, rtol=0)
    assert (training_codes > 0).sum() == 5 * len(x)
    ours.threshold.fill_(0.3)
    theirs.running_threshold = torch.tensor(0.3, dtype=torch.float64)
    theirs.eval()
    torch.testing.assert_close(ours.encode(x), theirs.encode(normalised)[1], atol=1e-12, rtol=0)


def test_batchtopk_threshold_follows_saelens_moving_average_of_the_smallest_kept_code():
    dictionary = BatchTopK(4, 6, k=2, threshold_rate=0.1)
    smallest = []
    for seed in range(3):
        codes = torch.relu(torch.randn(5, 6, generator=torch.Generator().manual_seed(seed))) + 0.01 * (seed + 1)
        dictionary.observe(codes)
        smallest.append(codes[codes > 0].min().item())
    expected = smallest[0]   # the first batch sets it; then θ <- θ + rate (min - θ)
    for value in smallest[1:]:
        expected += 0.1 * (value - expected)
    assert dictionary.threshold.item() == pytest.approx(expected, rel=1e-12)


def test_auxk_is_gao_et_als_normalised_residual_loss_over_the_top_dead_concepts():
    g = torch.Generator().manual_seed(0)
    pre, residual = torch.randn(3, 5, generator=g), torch.randn(3, 4, generator=g)
    W_dec = torch.randn(5, 4, generator=g)
    dead = torch.tensor([True, False, True, True, False])
    expected = 0.0
    for t in range(3):   # each token: its k_aux = 2 largest dead pre-activations, through a ReLU
        order = sorted((i for i in range(5) if dead[i]), key=lambda i: -pre[t, i].item())[:2]
        revived = sum(max(pre[t, i].item(), 0.0) * W_dec[i] for i in order)
        expected += (residual[t] - revived).square().sum().item()
    expected /= residual.square().sum().item()
    assert auxk(pre, residual, dead, W_dec, 2).item() == pytest.approx(expected, rel=1e-5)


def test_the_decoder_gradient_along_each_row_is_removed_and_the_rest_kept():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 4, generator=g)
    rows /= rows.norm(dim=1, keepdim=True)
    gradient = torch.randn(5, 4, generator=g)
    W_dec = torch.nn.Parameter(rows.clone())
    W_dec.grad = gradient.clone()
    remove_parallel_gradient(W_dec)
    assert (W_dec.grad * rows).sum(1).abs().max() < 1e-6
    across = gradient - (gradient @ rows.T).diagonal()[:, None] * rows
    torch.testing.assert_close(W_dec.grad, across)
    # and unrecorded: a gradient with a history would keep every step's graph alive (memory growing each epoch)
    assert W_dec.grad.grad_fn is None and not W_dec.grad.requires_grad


# ---- metrics, worked by hand ----------------------------------------------------------------------------

def constant_dictionary(reconstruction: list[float]) -> Standard:
    """A standard dictionary whose codes are all 0, so every token reconstructs as b_dec."""
    dictionary = Standard(len(reconstruction), 1)
    with torch.no_grad():
        dictionary.b_enc.fill_(-1.0)
        dictionary.b_dec.copy_(torch.tensor(reconstruction))
    return dictionary.eval()


def test_fvu_subtracts_the_per_dimension_mean_not_one_scalar_mean():
    # CONCEPTS.md: x = [[0, 10], [2, 10]], x̂ = [[1, 10], [1, 10]]: FVU 2/2 = 1 (a scalar mean would give 2/83)
    result = concepts.metrics(constant_dictionary([1.0, 10.0]), torch.tensor([[0.0, 10.0], [2.0, 10.0]]))
    assert result.fvu == pytest.approx(1.0, abs=1e-12)
    assert result.explained_variance == pytest.approx(0.0, abs=1e-12)
    assert (result.l0, result.dead, result.dense, result.tokens) == (0.0, 1.0, 0.0, 2)


def test_metrics_of_a_hand_worked_relu_dictionary_streamed_or_whole():
    # codes (ReLU(x/2), ReLU(-x)), x̂ = code_0 - code_1: for x = 0, 2, 4 the codes are (0,0), (1,0), (2,0) and
    # x̂ = 0, 1, 2: errors 0 + 1 + 4 = 5 over a spread about the mean 2 of 4 + 0 + 4 = 8
    dictionary = Standard(1, 2)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.tensor([[0.5, -1.0]]))
        dictionary.W_dec.copy_(torch.tensor([[1.0], [-1.0]]))
    x = torch.tensor([[0.0], [2.0], [4.0]])
    for activations, batch_size in ((x, 4096), (x, 1), ([x[:2], x[2:]], 4096)):
        result = concepts.metrics(dictionary.eval(), activations, batch_size=batch_size)
        assert result.fvu == pytest.approx(5 / 8, abs=1e-12)
        assert result.l0 == pytest.approx(2 / 3) and result.tokens == 3
        assert (result.dead, result.dense) == (0.5, 0.5)
        torch.testing.assert_close(result.firing, torch.tensor([2 / 3, 0.0], dtype=torch.float64))


def test_fvu_keeps_a_small_variance_under_a_large_offset():
    # activations at 1e4 with a spread of 0.1: float32 sums of squares would lose the variance entirely
    g = torch.Generator().manual_seed(0)
    x = (1e4 + 0.1 * torch.randn(20_000, 4, generator=g)).float()
    dictionary = Standard(4, 4)
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.eye(4))
        dictionary.W_dec.copy_(0.5 * torch.eye(4))
        dictionary.normalisation.offset.fill_(1e4)
    with torch.no_grad():
        reconstruction = dictionary.eval()(x).double().numpy()
    x64 = x.double().numpy()
    expected = ((x64 - reconstruction) ** 2).sum() / ((x64 - x64.mean(0)) ** 2).sum()
    assert concepts.metrics(dictionary, x, batch_size=1000).fvu == pytest.approx(expected, rel=1e-9)


# ---- repeatable, resumable -------------------------------------------------------------------------------

def assert_same_dictionary(a, b):
    assert a.state_dict().keys() == b.state_dict().keys()
    for name, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[name]), name
    assert a.training_record == b.training_record


def test_training_is_repeatable_for_a_seed_and_differs_for_another():
    x, _ = planted(tokens=2048, d=8, n=12, k=2)
    runs = [concepts.train(x, kind="topk", k=2, expansion=2, batch_size=256, seed=seed, progress=False)
            for seed in (3, 3, 4)]
    assert_same_dictionary(runs[0], runs[1])
    assert not torch.equal(runs[0].W_dec, runs[2].W_dec)


def test_a_run_interrupted_mid_epoch_resumes_to_the_unbroken_dictionary(tmp_path):
    x, _ = planted(tokens=1280, d=8, n=12, k=2)
    stream = [x[i:i + 100] for i in range(0, 1280, 100)]   # re-cut into batches of 128 tokens: 10 a pass
    settings = dict(kind="batchtopk", k=2, expansion=4, epochs=3, batch_size=128, dead_after=256, warmup=5,
                    progress=False)
    unbroken = concepts.train(stream, **settings)
    checkpoint = tmp_path / "run.ckpt"
    interrupted = Interrupting(stream, at=len(stream) + 7)   # in the second pass
    with pytest.raises(KeyboardInterrupt):
        concepts.train(interrupted, checkpoint=checkpoint, checkpoint_every=4, **settings)
    assert torch.load(checkpoint, weights_only=True)["position"]["step"] == 12   # epoch 1's 10, then 2 of epoch 2
    resumed = concepts.train(interrupted, checkpoint=checkpoint, checkpoint_every=4, **settings)
    assert_same_dictionary(resumed, unbroken)
    assert resumed.training_record["steps"] == 30


def test_a_finished_run_extended_by_an_epoch_equals_the_longer_run(tmp_path):
    x, _ = planted(tokens=1500, d=8, n=12, k=2)
    settings = dict(kind="topk", k=2, expansion=2, batch_size=256, progress=False)
    longer = concepts.train(x, epochs=2, **settings)
    concepts.train(x, epochs=1, checkpoint=tmp_path / "run.ckpt", **settings)
    extended = concepts.train(x, epochs=2, checkpoint=tmp_path / "run.ckpt", **settings)
    assert_same_dictionary(extended, longer)


def test_steps_count_the_run_across_passes_and_a_later_call_extends_them(tmp_path):
    x, _ = planted(tokens=1024, d=8, n=12, k=2)   # 4 steps of 256 a pass
    settings = dict(kind="topk", k=2, expansion=2, batch_size=256, warmup=3, progress=False)
    ten = concepts.train(x, steps=10, **settings)
    assert ten.training_record["steps"] == 10 and ten.training_record["epochs"] == 2.5
    assert_same_dictionary(concepts.train(x, steps=8, **settings), concepts.train(x, epochs=2, **settings))
    concepts.train(x, steps=6, checkpoint=tmp_path / "run.ckpt", **settings)   # stops in the second pass
    assert_same_dictionary(concepts.train(x, steps=10, checkpoint=tmp_path / "run.ckpt", **settings), ten)
    with pytest.raises(ConceptsError, match="steps=5 may need the activations more than once"):
        concepts.train(iter([x]), steps=5, **settings)
    with pytest.raises(ConceptsError, match="steps must be a whole number of at least 1, not 0"):
        concepts.train(x, steps=0, **settings)


def test_the_command_lines_schedule_is_long_enough_and_warms_up_a_tenth_of_it():
    from vitviz.concepts.build import schedule_of
    from vitviz.concepts.train.single import TRAINING_TOKENS

    photos = 3000 * 64   # 3,000 CIFAR-10 images' 8 x 8 patch tokens: one pass is 47 steps of 4,096
    assert schedule_of(photos, epochs=None, steps=None, warmup=None, batch_size=4096) == {
        "steps": math.ceil(TRAINING_TOKENS / 4096), "warmup": math.ceil(TRAINING_TOKENS / 4096) // 10}
    many = 2_000_000 * 64   # a large data set: one pass, the warm-up at most 100 steps
    assert schedule_of(many, epochs=None, steps=None, warmup=None, batch_size=4096) == {"steps": 31250, "warmup": 100}
    assert schedule_of(photos, epochs=2, steps=None, warmup=None, batch_size=4096) == {"epochs": 2, "warmup": 9}
    assert schedule_of(photos, epochs=2, steps=None, warmup=100, batch_size=4096) == {"epochs": 2, "warmup": 100}
    with pytest.raises(ConceptsError, match="Give epochs .2. or steps .9., not both"):
        schedule_of(photos, epochs=2, steps=9, warmup=None, batch_size=4096)


def test_a_dictionary_that_explains_little_says_so_in_words_and_its_record_keeps_it():
    noise = torch.randn(2048, 32, generator=torch.Generator().manual_seed(0))   # no structure: k=1 rebuilds little
    with pytest.warns(UserWarning, match=r"explains only \d+% of its layer's variance .FVU 0\.\d\d; a usable one is "
                                         r"below 0.5.\. Train on more images, for more steps"):
        poor = concepts.train(noise, kind="topk", k=1, expansion=2, batch_size=256, progress=False)
    assert poor.training_record["fvu"] >= 0.5 and "smaller k" in poor.training_record["warning"]
    x, _ = planted(tokens=2048, d=8, n=12, k=2)
    good = concepts.train(x, kind="topk", k=2, expansion=4, epochs=4, batch_size=64, lr=3e-3, warmup=10,
                          progress=False)
    assert good.training_record["fvu"] < 0.5 and "warning" not in good.training_record
    assert good.training_record["fvu"] == pytest.approx(concepts.metrics(good, x).fvu, abs=0.05)   # its first tokens
    from vitviz.concepts.train.single import fit_warning
    assert "less of its layer than the layer's mean does (FVU 1.10, at least 1)" in fit_warning(1.1)


# ---- the file ------------------------------------------------------------------------------------------------

def trained_batchtopk():
    x, _ = planted(tokens=1024, d=8, n=12, k=2)
    return concepts.train(x, kind="batchtopk", k=2, expansion=2, batch_size=128, progress=False, model="vit-cifar10",
                          revision="main", block=6, tokens="patch"), x


def test_save_then_load_gives_the_same_dictionary_from_a_file_or_a_folder(tmp_path):
    dictionary, x = trained_batchtopk()
    for target in (tmp_path / "vit.safetensors", tmp_path / "folder"):
        written = concepts.save(dictionary, target)
        loaded = concepts.load(target)
        assert type(loaded) is BatchTopK and loaded.settings() == dictionary.settings()
        assert (loaded.model, loaded.block, loaded.origin) == ("vit-cifar10", 6, ORIGIN)
        assert (loaded.d, loaded.n_concepts) == (8, 16)
        assert_same_dictionary(loaded, dictionary)
        torch.testing.assert_close(loaded.encode(x), dictionary.encode(x), atol=0, rtol=0)
        torch.testing.assert_close(loaded.decode(loaded.encode(x)), dictionary(x), atol=0, rtol=0)
        assert not list(written.parent.glob(".*.tmp"))


def test_a_truncated_file_is_refused_as_damaged(tmp_path):
    path = concepts.save(trained_batchtopk()[0], tmp_path / "d.safetensors")
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ConceptsError, match="is damaged or not a safetensors file"):
        concepts.load(path)


def test_a_file_with_a_changed_byte_is_refused_as_damaged(tmp_path):
    path = concepts.save(trained_batchtopk()[0], tmp_path / "d.safetensors")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40   # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(ConceptsError, match="damaged: its tensors are not the ones it was written with"):
        concepts.load(path)


def test_nan_weights_are_refused_when_loading_and_never_saved(tmp_path):
    dictionary = trained_batchtopk()[0]
    path = concepts.save(dictionary, tmp_path / "d.safetensors")
    header = json.loads(load_header(path))
    tensors = load_file(path)
    tensors["W_dec"][3, 1] = float("nan")
    digest = hashlib.sha256()   # the checksum as own.py documents it: each name and its bytes, in name order
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    header["sha256"] = digest.hexdigest()
    save_file(tensors, path, metadata={"vitviz_concepts": json.dumps(header)})
    with pytest.raises(ConceptsError, match="NaN or infinite values in W_dec"):
        concepts.load(path)
    with torch.no_grad():
        dictionary.W_enc[0, 0] = float("inf")
    with pytest.raises(ConceptsError, match="NaN or infinite values in W_enc"):
        concepts.save(dictionary, tmp_path / "never.safetensors")
    assert not (tmp_path / "never.safetensors").exists()


def load_header(path) -> str:
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return f.metadata()["vitviz_concepts"]


def test_a_file_from_a_newer_vitviz_is_refused_in_words(tmp_path):
    path = concepts.save(trained_batchtopk()[0], tmp_path / "d.safetensors")
    header = json.loads(load_header(path))
    save_file(load_file(path), path, metadata={"vitviz_concepts": json.dumps({**header, "version": 99})})
    with pytest.raises(ConceptsError, match="written by a newer vitviz .format version 99"):
        concepts.load(path)


def test_activations_of_another_width_are_refused_naming_what_it_was_trained_on():
    dictionary = random_dictionary(TopK, k=3)
    with pytest.raises(ConceptsError, match=r"trained on 16-wide activations \(vit-cifar10@main block 7 "
                                            r"\(index 6\), patch "
                                            r"tokens\); these are 8 wide"):
        dictionary.encode(torch.zeros(4, 8))
    with pytest.raises(ConceptsError, match="trained on 16-wide"):
        concepts.metrics(dictionary, torch.zeros(10, 8))


class RunsCode:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('RAN').write_text('code ran')",))


def test_a_pickle_holding_code_is_never_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("sae.pt", "fake.safetensors"):
        (tmp_path / name).write_bytes(pickle.dumps({"W_enc": RunsCode()}))
    with pytest.raises(ConceptsError, match="is not a dictionary vitviz reads"):
        concepts.load(tmp_path / "sae.pt")
    with pytest.raises(ConceptsError, match="is damaged or not a safetensors file"):
        concepts.load(tmp_path / "fake.safetensors")
    x, _ = planted(tokens=256, d=8, n=12, k=2)
    torch.save({"settings": RunsCode()}, tmp_path / "run.ckpt")
    with pytest.raises(ConceptsError, match="holds pickled objects other than numbers, which are never loaded"):
        concepts.train(x, kind="topk", k=2, checkpoint=tmp_path / "run.ckpt", progress=False)
    assert not (tmp_path / "RAN").exists()


def test_missing_and_foreign_sources_are_refused_in_words(tmp_path):
    with pytest.raises(ConceptsError, match="There is no file or folder"):
        concepts.load(tmp_path / "nowhere")
    with pytest.raises(ConceptsError, match="is not a dictionary vitviz reads; vitviz reads its own dictionaries"):
        concepts.load(tmp_path)
    save_file({"weight": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ConceptsError, match="is a safetensors file, but not a vitviz dictionary"):
        concepts.load(tmp_path / "model.safetensors")


# ---- training refuses what it cannot do -----------------------------------------------------------------

def test_a_checkpoint_of_another_run_is_refused_naming_the_setting(tmp_path):
    x, _ = planted(tokens=512, d=8, n=12, k=2)
    concepts.train(x, kind="topk", k=2, batch_size=128, checkpoint=tmp_path / "run.ckpt", progress=False)
    with pytest.raises(ConceptsError, match="checkpoint of another run: its k is 2, this run's is 3"):
        concepts.train(x, kind="topk", k=3, batch_size=128, checkpoint=tmp_path / "run.ckpt", progress=False)


def test_training_refuses_bad_activations_and_settings_in_words():
    x, _ = planted(tokens=512, d=8, n=12, k=2)
    broken = x.clone()
    broken[300, 2] = float("nan")
    with pytest.raises(ConceptsError, match="diverged at step 2: the loss is nan .the activations hold NaN"):
        concepts.train([broken[:256], broken[256:]], kind="topk", k=2, batch_size=256, norm_tokens=256,
                       progress=False)
    with pytest.raises(ConceptsError, match="The activations hold NaN or infinite values among the first 512 tokens"):
        concepts.train(broken, kind="topk", k=2, progress=False)
    with pytest.raises(ConceptsError, match="Batch 2 of the activations is 4 wide; the ones before were 8 wide"):
        concepts.train([x, x[:, :4]], kind="topk", k=2, batch_size=64, norm_tokens=64, progress=False)
    with pytest.raises(ConceptsError, match="a standard dictionary is made sparse by its L1 penalty"):
        concepts.train(x, kind="standard", k=4, progress=False)
    with pytest.raises(ConceptsError, match="no dictionary kind 'jumprelu'; the kinds are standard, topk, batchtopk"):
        concepts.train(x, kind="jumprelu", progress=False)
    with pytest.raises(ConceptsError, match="an iterator can be read only once"):
        concepts.train(iter([x]), kind="topk", k=2, epochs=2, progress=False)
    with pytest.raises(ConceptsError, match="k = 40 concepts per token is not possible in a dictionary of 16"):
        concepts.train(x, kind="topk", k=40, expansion=2, progress=False)
    with pytest.raises(ConceptsError, match="nothing for a dictionary to explain"):
        concepts.train(torch.ones(64, 8), kind="topk", k=2, progress=False)
    with pytest.raises(ConceptsError, match="no inference threshold yet"):
        BatchTopK(8, 16, k=2).encode(x)
