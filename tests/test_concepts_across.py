"""vitviz.concepts' dictionary across models (Thasarathan et al. 2025): its type, training, metrics and files
(`kinds/across.py`, `train/across.py`, `analysis/across.py`, `files/across.py`).

References are built independently: two planted "models" made from one sparse code with known atoms, a
hand-worked case and a float64 numpy computation of the metrics, metrics.py's FVU for the diagonal, and
an unbroken run for a resumed one.
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from interrupting import Interrupting
from vitviz import concepts
from vitviz.concepts import BatchTopK, ConceptsError, Origin, TopK
from vitviz.concepts.analysis.across import COFIRING_FROM, SHARED_FROM, SPECIFIC_TO, across_metrics
from vitviz.concepts.files.across import MANIFEST, matches, read, save_across
from vitviz.concepts.kinds.across import Across
from vitviz.concepts.train.across import train_across

COSINE = 0.9   # a true atom is found when a one-to-one matching gives it a decoder row at least this close


def unit_rows(generator: torch.Generator, n: int, d: int) -> torch.Tensor:
    rows = torch.randn(n, d, generator=generator)
    return rows / rows.norm(dim=1, keepdim=True)


def sparse_codes(generator: torch.Generator, tokens: int, n: int, k: int) -> torch.Tensor:
    """k of n codes per token, each in [0.5, 1.5]."""
    chosen = torch.rand(tokens, n, generator=generator).argsort(1)[:, :k]
    return torch.zeros(tokens, n).scatter(1, chosen, torch.rand(tokens, k, generator=generator) + 0.5)


def planted_pair(*, tokens: int, widths=(24, 32), n_shared: int = 24, n_own: int = 8, seed: int = 0):
    """Two "models" of one place: each token's 3 of `n_shared` shared codes, mapped by each model's own
    dictionary (its width's unit atoms), plus 1 of the model's `n_own` own atoms, whose codes are drawn for
    each model apart (so nothing in one model's tokens predicts the other's own part), noise and an offset.
    -> (activations per model, (shared atoms, own atoms) per model)."""
    g = torch.Generator().manual_seed(2000 + seed)
    shared = sparse_codes(g, tokens, n_shared, 3)
    activations, atoms = [], []
    for d in widths:
        shared_atoms, own_atoms = unit_rows(g, n_shared, d), unit_rows(g, n_own, d)
        x = shared @ shared_atoms + sparse_codes(g, tokens, n_own, 1) @ own_atoms
        activations.append(x + 0.01 * torch.randn(tokens, d, generator=g) + 2.0)
        atoms.append((shared_atoms, own_atoms))
    return activations, atoms


def matched(atoms: torch.Tensor, dictionary) -> tuple[np.ndarray, np.ndarray]:
    """Each true atom's cosine with the decoder row a one-to-one (Hungarian) assignment gives it, and that row."""
    cosine = (atoms @ dictionary.W_dec.detach().T).numpy()
    rows, columns = linear_sum_assignment(-cosine)
    return cosine[rows, columns], columns


# ---- training finds what was planted ---------------------------------------------------------------------

def test_the_dictionary_across_two_models_finds_their_shared_atoms_as_shared_and_their_own_as_theirs():
    # The loss leaves open whether two models' own directions share one concept ("paired": firing entropy 1,
    # co-firing 0; across.py's docstring), so how many own atoms are found varies with the data seed (25-100 %
    # per model over seeds 0-3; shared atoms 88-96 %): the thresholds below hold for this seed with margin,
    # and what holds for every seed is asserted exactly: a found own atom is never counted shared.
    x, atoms = planted_pair(tokens=16_000)
    across = train_across(x, models=["a", "b"], blocks=0, tokens="patch", kind="topk", k=4, n_concepts=64, epochs=2,
                          batch_size=64, lr=1e-2, warmup=10, progress=False)
    result = across_metrics(across, x)
    (cosine_a, concept_a), (cosine_b, concept_b) = (matched(torch.cat(model_atoms), dictionary)
                                                    for model_atoms, dictionary in zip(atoms, across.per_model))
    n_shared, shared = len(atoms[0][0]), set(result.shared_concepts.tolist())
    found_in_both = (cosine_a[:n_shared] >= COSINE) & (cosine_b[:n_shared] >= COSINE)
    one_concept = concept_a[:n_shared] == concept_b[:n_shared]
    counted_shared = np.isin(concept_a[:n_shared], list(shared))
    assert (found_in_both & one_concept & counted_shared).mean() >= 0.8   # 0.92
    assert (result.entropy[concept_a[:n_shared][one_concept]] >= SHARED_FROM).all()

    own_found = []
    for model, cosine, concept in (("a", cosine_a, concept_a), ("b", cosine_b, concept_b)):
        found = concept[n_shared:][cosine[n_shared:] >= COSINE]
        assert not set(found.tolist()) & shared, model
        specific = result.entropy[found] <= SPECIFIC_TO
        assert specific.double().mean() >= 0.75, model   # 1.0 in both
        assert set(found[specific.numpy()].tolist()) <= set(result.specific_concepts[model].tolist()), model
        own_found.append(len(found) / len(atoms[0][1]))
    assert np.mean(own_found) >= 0.75, own_found   # 1.0 and 0.88
    assert result.r2.diagonal().min() > 0.85 and result.r2[0, 1] > 0.55 and result.r2[1, 0] > 0.55


def test_training_shows_the_running_fvu_and_l0(capsys):
    x, _ = planted_pair(tokens=512, widths=(6, 8), n_shared=6, n_own=2)
    train_across(x, models=["a", "b"], blocks=0, tokens="patch", k=2, n_concepts=12, batch_size=128)
    shown = capsys.readouterr().err
    assert "topk dictionary across 2 models" in shown and "FVU=" in shown and "L0=2.0" in shown


def test_decoder_rows_stay_unit_norm_and_n_concepts_follow_the_widest_model():
    x, _ = planted_pair(tokens=1024, widths=(6, 8), n_shared=6, n_own=2)
    for kind in ("topk", "batchtopk"):
        across = train_across(x, models=["a", "b"], blocks=[3, 5], tokens="patch", kind=kind, k=2, expansion=2,
                              batch_size=128, lr=3e-3, progress=False)
        assert across.n_concepts == 16 and across.d == (6, 8) and across.kind == kind
        for dictionary in across.per_model:
            torch.testing.assert_close(dictionary.W_dec.detach().norm(dim=1), torch.ones(16), atol=1e-5, rtol=0)
        assert [dictionary.origin for dictionary in across.per_model] == [Origin("a", None, 3, "patch"),
                                                                          Origin("b", None, 5, "patch")]


def test_each_model_has_its_own_normalisation_from_its_own_tokens():
    x, _ = planted_pair(tokens=640, widths=(6, 8), n_shared=6, n_own=2)
    x[1] = x[1] * 7 - 3
    across = train_across(x, models=["a", "b"], blocks=0, tokens="patch", k=2, n_concepts=12, batch_size=64,
                          norm_tokens=640, progress=False)
    for dictionary, tokens in zip(across.per_model, x):
        tokens = tokens.double()
        torch.testing.assert_close(dictionary.normalisation.offset, tokens.mean(0).float())
        torch.testing.assert_close(dictionary.normalisation.scale, (tokens - tokens.mean(0)).square().mean().sqrt()
                                   .float())


# ---- metrics: hand-worked, and against numpy -------------------------------------------------------------

def identity_topk(model: str, decoder_rows: list[list[float]]) -> TopK:
    """A TopK (k = 1) over 3 dimensions with 4 concepts: concept i < 3 reads dimension i, concept 3 never fires
    (its pre-activation is its bias, -1); no normalisation, no other biases."""
    dictionary = TopK(3, 4, k=1, origin=Origin(model=model))
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]))
        dictionary.b_enc.copy_(torch.tensor([0.0, 0, 0, -1]))
        dictionary.W_dec.copy_(torch.tensor(decoder_rows))
    return dictionary.eval()


def test_metrics_of_a_hand_worked_pair_shared_own_paired_and_unused_concepts():
    # A's tokens fire concepts 0, 0, 1, 2; B's 0, 0, none, 1. Concept 0 fires at the same rows in both (shared),
    # concept 1 as often in both but at different rows (paired: entropy 1, co-firing 0), concept 2 in A alone,
    # concept 3 nowhere. Decoding is the identity, so A reconstructs exactly and B misses its row 2 (error 3).
    rows = [[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]]
    across = Across([identity_topk("A", rows), identity_topk("B", rows)])
    x_a = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    x_b = torch.tensor([[1.0, 0, 0], [1, 0, 0], [-1, -1, -1], [0, 1, 0]])
    result = across_metrics(across, [x_a, x_b], batch_size=3)
    # spreads about the means: A 0.375 + 0.375 + 0.875 + 0.875 = 2.5, B 0.625 + 0.625 + 3.125 + 1.125 = 5.5;
    # errors: A->A 0, A->B 0 + 0 + 6 + 2 = 8, B->A 0 + 0 + 1 + 2 = 3, B->B 3
    expected = torch.tensor([[1.0, 1 - 8 / 5.5], [1 - 3 / 2.5, 1 - 3 / 5.5]], dtype=torch.float64)
    torch.testing.assert_close(result.r2, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(result.firing, torch.tensor([[0.5, 0.25, 0.25, 0], [0.5, 0.25, 0, 0]],
                                                           dtype=torch.float64))
    torch.testing.assert_close(result.entropy[:3], torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(result.cofiring[:3], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert math.isnan(result.entropy[3]) and math.isnan(result.cofiring[3])
    assert result.shared_concepts.tolist() == [0] and result.shared == 0.25 and result.unused == 0.25
    assert {model: ids.tolist() for model, ids in result.specific_concepts.items()} == {"A": [2], "B": []}
    assert result.specific == {"A": 0.25, "B": 0.0}
    assert result.l0 == {"A": 1.0, "B": 0.75} and result.dead == {"A": 0.25, "B": 0.5} and result.tokens == 4
    np.testing.assert_allclose(result.to_dict()["r2"], expected.numpy(), atol=1e-12, rtol=0)


def random_across(widths=(6, 8), n=10, k=3, seed=0) -> Across:
    """An across dictionary of random weights and normalisations, in float64."""
    g = torch.Generator().manual_seed(seed)
    dictionaries = []
    for m, d in enumerate(widths):
        dictionary = TopK(d, n, k=k, origin=Origin(model=f"model-{m}"))
        with torch.no_grad():
            dictionary.W_enc.copy_(torch.randn(d, n, generator=g) / math.sqrt(d))
            dictionary.b_enc.copy_(0.1 * torch.randn(n, generator=g))
            dictionary.W_dec.copy_(unit_rows(g, n, d))
            dictionary.b_dec.copy_(0.2 * torch.randn(d, generator=g))
            dictionary.normalisation.offset.copy_(torch.randn(d, generator=g))
            dictionary.normalisation.scale.fill_(1.5 + m)
        dictionaries.append(dictionary)
    return Across(dictionaries).double().eval()


def numpy_metrics(across: Across, x: list[np.ndarray]):
    """The R² matrix, firing shares, entropy and co-firing written out in float64 numpy."""
    weights = [{name: value.numpy() for name, value in dictionary.state_dict().items()}
               for dictionary in across.per_model]

    def encode(w, tokens, k):
        pre = ((tokens - w["normalisation.offset"]) / w["normalisation.scale"] - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
        keep = np.argsort(-pre, axis=1)[:, :k]
        codes = np.zeros_like(pre)
        np.put_along_axis(codes, keep, np.maximum(np.take_along_axis(pre, keep, 1), 0), 1)
        return codes

    codes = [encode(w, tokens, dictionary.k) for w, tokens, dictionary in zip(weights, x, across.per_model)]
    r2 = np.empty((len(x), len(x)))
    for i in range(len(x)):
        for j, (w, target) in enumerate(zip(weights, x)):
            reconstruction = (codes[i] @ w["W_dec"] + w["b_dec"]) * w["normalisation.scale"] + w["normalisation.offset"]
            r2[i, j] = 1 - ((target - reconstruction) ** 2).sum() / ((target - target.mean(0)) ** 2).sum()
    fires = np.stack([c > 0 for c in codes])
    firing = fires.mean(1)
    p = firing / firing.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.where(p > 0, p * np.log(p), 0).sum(0) / np.log(len(x))
        entropy[firing.sum(0) == 0] = np.nan
        pairs = [(a, b) for a in range(len(x)) for b in range(a + 1, len(x))]   # each pair's Jaccard, averaged
        cofiring = np.mean([(fires[a] & fires[b]).sum(0) / np.maximum((fires[a] | fires[b]).sum(0), 1)
                            for a, b in pairs], axis=0)
        cofiring[firing.sum(0) == 0] = np.nan
    return r2, firing, entropy, cofiring


@pytest.mark.parametrize("widths", [(6, 8), (6, 8, 5)])
def test_metrics_equal_a_float64_numpy_computation_streamed_in_small_batches(widths):
    across = random_across(widths)
    g = torch.Generator().manual_seed(1)
    x = [(torch.randn(203, d, generator=g) * 2 + 1).float() for d in across.d]   # float32 values, as batches read
    result = across_metrics(across, x, batch_size=17)
    r2, firing, entropy, cofiring = numpy_metrics(across, [tokens.double().numpy() for tokens in x])
    np.testing.assert_allclose(result.r2.numpy(), r2, rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.firing.numpy(), firing, rtol=0, atol=1e-15)
    np.testing.assert_allclose(result.entropy.numpy(), entropy, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.cofiring.numpy(), cofiring, rtol=0, atol=1e-12)
    expected_shared = np.flatnonzero((entropy >= SHARED_FROM) & (cofiring >= COFIRING_FROM))
    assert result.shared_concepts.tolist() == expected_shared.tolist()
    for model, dictionary, tokens, own_r2 in zip(across.models, across.per_model, x, r2.diagonal()):
        single = concepts.metrics(dictionary, tokens)   # metrics.py's FVU and L0 of the model's own dictionary
        assert single.explained_variance == pytest.approx(own_r2, abs=1e-10)
        assert result.l0[model] == pytest.approx(single.l0, abs=1e-12) and result.dead[model] == single.dead


def test_metrics_refuse_unaligned_or_constant_activations_in_words():
    across = random_across()
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(40, d, generator=g) for d in across.d]
    with pytest.raises(ConceptsError, match=r"not aligned: the models hold different numbers of tokens \(model-0 40, "
                                            r"model-1 39\)"):
        across_metrics(across, [x[0], x[1][:39]])
    with pytest.raises(ConceptsError, match=r"not aligned: after 32 tokens, the next batch holds different numbers"):
        across_metrics(across, [[x[0]], [x[1][:32], x[1][32:39]]], batch_size=16)
    with pytest.raises(ConceptsError, match="one set of activations per model, in a list in the order of its models "
                                            r"\(model-0, model-1\); a Tensor given"):
        across_metrics(across, x[0])
    with pytest.raises(ConceptsError, match="The 40 tokens of model-1 evaluated are all the same vector"):
        across_metrics(across, [x[0], torch.ones(40, 8)])
    with pytest.raises(ConceptsError, match="trained on 8-wide activations"):
        across_metrics(across, [x[0], x[0]])


# ---- repeatable, resumable ----------------------------------------------------------------------------------

def assert_same_across(a: Across, b: Across):
    assert a.models == b.models and a.state_dict().keys() == b.state_dict().keys()
    for name, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[name]), name
    assert a.training_record == b.training_record


SMALL = dict(models=["a", "b"], blocks=0, tokens="patch", k=2, n_concepts=16, batch_size=128, warmup=5,
             progress=False)


def test_training_is_repeatable_for_a_seed_and_differs_for_another():
    x, _ = planted_pair(tokens=1024, widths=(6, 8), n_shared=6, n_own=2)
    runs = [train_across(x, seed=seed, **SMALL) for seed in (3, 3, 4)]
    assert_same_across(runs[0], runs[1])
    assert not torch.equal(runs[0].per_model[1].W_dec, runs[2].per_model[1].W_dec)


def test_a_run_interrupted_mid_epoch_resumes_to_the_unbroken_dictionary(tmp_path):
    x, _ = planted_pair(tokens=1280, widths=(6, 8), n_shared=6, n_own=2)
    streams = [[tokens[i:i + 100] for i in range(0, 1280, 100)] for tokens in x]   # re-cut into 10 batches a pass
    settings = dict(SMALL, kind="batchtopk", epochs=3, dead_after=256)
    unbroken = train_across(streams, **settings)
    interrupted = Interrupting(streams[1], at=len(streams[1]) + 7)   # model b's, in the second pass
    checkpoint = tmp_path / "run.ckpt"
    with pytest.raises(KeyboardInterrupt):
        train_across([streams[0], interrupted], checkpoint=checkpoint, checkpoint_every=4, **settings)
    assert torch.load(checkpoint, weights_only=True)["position"]["step"] == 12   # epoch 1's 10, then 2 of epoch 2
    resumed = train_across([streams[0], interrupted], checkpoint=checkpoint, checkpoint_every=4, **settings)
    assert_same_across(resumed, unbroken)
    assert resumed.training_record["steps"] == 30 and resumed.training_record["models"] == ["a", "b"]


def test_a_finished_run_extended_by_an_epoch_equals_the_longer_run(tmp_path):
    x, _ = planted_pair(tokens=1000, widths=(6, 8), n_shared=6, n_own=2)
    longer = train_across(x, epochs=2, **SMALL)
    train_across(x, epochs=1, checkpoint=tmp_path / "run.ckpt", **SMALL)
    extended = train_across(x, epochs=2, checkpoint=tmp_path / "run.ckpt", **SMALL)
    assert_same_across(extended, longer)


class RunsCode:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('RAN').write_text('code ran')",))


def test_a_checkpoint_of_another_run_or_holding_code_is_refused(tmp_path, monkeypatch):
    x, _ = planted_pair(tokens=256, widths=(6, 8), n_shared=6, n_own=2)
    train_across(x, checkpoint=tmp_path / "run.ckpt", **SMALL)
    with pytest.raises(ConceptsError, match="checkpoint of another run: its origins is"):
        train_across(x, checkpoint=tmp_path / "run.ckpt", **dict(SMALL, models=["a", "c"]))
    monkeypatch.chdir(tmp_path)
    torch.save({"settings": RunsCode()}, tmp_path / "code.ckpt")
    with pytest.raises(ConceptsError, match="holds pickled objects other than numbers, which are never loaded"):
        train_across(x, checkpoint=tmp_path / "code.ckpt", **SMALL)
    assert not (tmp_path / "RAN").exists()


def test_training_refuses_what_it_cannot_do_in_words():
    x, _ = planted_pair(tokens=256, widths=(6, 8), n_shared=6, n_own=2)
    with pytest.raises(ConceptsError, match=r"not aligned: the models hold different numbers of tokens \(a 256, b 200"):
        train_across([x[0], x[1][:200]], **SMALL)
    with pytest.raises(ConceptsError, match="needs two models or more; 1 given"):
        train_across(x[:1], **dict(SMALL, models=["a"]))
    with pytest.raises(ConceptsError, match="a is named twice"):
        train_across(x, **dict(SMALL, models=["a", "a"]))
    with pytest.raises(ConceptsError, match="1 blocks for 2 models"):
        train_across(x, **dict(SMALL, blocks=[0]))
    with pytest.raises(ConceptsError, match="of kind topk or batchtopk; a standard dictionary is made sparse by a "
                                            "penalty"):
        train_across(x, **dict(SMALL, kind="standard"))
    with pytest.raises(ConceptsError, match="no dictionary kind 'jumprelu'"):
        train_across(x, **dict(SMALL, kind="jumprelu"))
    with pytest.raises(ConceptsError, match=r"Give n_concepts \(16\) or expansion \(2\), not both"):
        train_across(x, expansion=2, **SMALL)
    with pytest.raises(ConceptsError, match="a Tensor given"):
        train_across(x[0], **SMALL)
    with pytest.raises(ConceptsError, match="an iterator can be read only once"):
        train_across([iter([x[0]]), [x[1]]], **dict(SMALL, epochs=2))
    broken = x[1].clone()
    broken[200, 3] = float("nan")
    streams = [[x[0][:128], x[0][128:]], [broken[:128], broken[128:]]]   # read in order: the NaN in the 2nd batch
    with pytest.raises(ConceptsError, match="diverged at step 2: the loss is nan .the activations hold NaN"):
        train_across(streams, **dict(SMALL, norm_tokens=128))


# ---- the files -------------------------------------------------------------------------------------------------

def trained_pair(models=("vit-cifar10", "facebook/dinov2-base")):
    x, _ = planted_pair(tokens=512, widths=(6, 8), n_shared=6, n_own=2)
    across = train_across(x, **dict(SMALL, models=list(models), kind="batchtopk", revisions=["main", None],
                                    blocks=[-1, 11]))
    return across, x


def test_save_then_read_gives_the_same_dictionary_across_models(tmp_path):
    across, x = trained_pair(models=("vit-cifar10", "../facebook/dinov2 base"))
    folder = save_across(across, tmp_path / "pair")
    names = sorted(path.name for path in folder.iterdir())
    assert names == ["0-vit-cifar10.safetensors", "1-facebook--dinov2-base.safetensors", MANIFEST]
    for source in (folder, folder / MANIFEST):
        assert matches(source)
        loaded = read(source)
        assert_same_across(loaded, across)
        assert [d.origin for d in loaded.per_model] == [d.origin for d in across.per_model]
        assert loaded.per_model[1].origin == Origin("../facebook/dinov2 base", None, 11, "patch")
        codes = loaded.encode(x[0], "vit-cifar10")
        torch.testing.assert_close(codes, across.encode(x[0], "vit-cifar10"), atol=0, rtol=0)
        torch.testing.assert_close(loaded.decode(codes, "../facebook/dinov2 base"),
                                   across.decode(codes, "../facebook/dinov2 base"), atol=0, rtol=0)
    # each model's file alone is an ordinary dictionary that says how it was trained
    alone = concepts.load(folder / "1-facebook--dinov2-base.safetensors")
    assert alone.training_record["models"] == list(across.models) and alone.n_concepts == 16
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["models"][0]["sha256"] == hashlib.sha256((folder / names[0]).read_bytes()).hexdigest()
    assert not matches(tmp_path) and not list(folder.glob(".*.tmp"))


def write_manifest(folder, **changes):
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, **changes}))


def test_damaged_or_inconsistent_folders_are_refused_in_words(tmp_path):
    across, _ = trained_pair()
    folder = save_across(across, tmp_path / "pair")
    manifest = json.loads((folder / MANIFEST).read_text())
    second = folder / manifest["models"][1]["file"]

    data = second.read_bytes()
    second.unlink()
    with pytest.raises(ConceptsError, match="is missing 1-facebook--dinov2-base.safetensors, the dictionary of "
                                            "facebook/dinov2-base: copy the whole folder again"):
        read(folder)

    other, _ = trained_pair()   # the same model's dictionary with its decoder turned round: a sound file, not this one
    with torch.no_grad():
        other.per_model[1].W_dec.mul_(-1)
    concepts.save(other.per_model[1], second)
    with pytest.raises(ConceptsError, match="is not the file this across dictionary was saved with"):
        read(folder)

    for other_kind, message in ((TopK(8, 16, k=2, origin=Origin("facebook/dinov2-base")),
                                 "is a topk dictionary, and across.json says the models' are batchtopk"),
                                (BatchTopK(8, 12, k=2, origin=Origin("facebook/dinov2-base")),
                                 "has 12 concepts, and across.json says the models share 16")):
        concepts.save(other_kind, second)   # a sound file, its SHA-256 in the manifest: only the two disagree
        fresh = {**manifest["models"][1], "sha256": hashlib.sha256(second.read_bytes()).hexdigest()}
        write_manifest(folder, models=[manifest["models"][0], fresh])
        with pytest.raises(ConceptsError, match="is inconsistent: 1-facebook--dinov2-base.safetensors " + message):
            read(folder)

    second.write_bytes(data)
    write_manifest(folder, models=[manifest["models"][0], {**manifest["models"][1], "model": "dinov2"}])
    with pytest.raises(ConceptsError, match="says 1-facebook--dinov2-base.safetensors is the dictionary of dinov2, "
                                            r"and the file says it is facebook/dinov2-base block 12 \(index 11\)"):
        read(folder)
    outside = {**manifest["models"][1], "file": "../elsewhere.safetensors"}
    write_manifest(folder, models=[manifest["models"][0], outside])
    with pytest.raises(ConceptsError, match="its files are in its own folder, by plain names"):
        read(folder)
    write_manifest(folder, models=[manifest["models"][0]], kind="batchtopk")
    with pytest.raises(ConceptsError, match="needs two models or more; 1 given"):
        read(folder)
    write_manifest(folder, version=99)
    with pytest.raises(ConceptsError, match="written by a newer vitviz .format version 99"):
        read(folder)
    write_manifest(folder, version=1, models="all")
    with pytest.raises(ConceptsError, match="is incomplete"):
        read(folder)
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ConceptsError, match="is damaged: it is not valid JSON"):
        read(folder)
    (folder / MANIFEST).unlink()
    assert not matches(folder)   # without its manifest, a folder is not an across dictionary


def test_nan_weights_are_never_saved_and_nothing_is_written(tmp_path):
    across, _ = trained_pair()
    with torch.no_grad():
        across.per_model[1].W_enc[0, 0] = float("nan")
    with pytest.raises(ConceptsError, match="The dictionary of facebook/dinov2-base to be saved in .* holds NaN"):
        save_across(across, tmp_path / "pair")
    assert not (tmp_path / "pair").exists()


def test_models_that_disagree_cannot_form_one_dictionary():
    with pytest.raises(ConceptsError, match="different numbers of concepts: a's has 4, b's 5"):
        Across([TopK(3, 4, k=1, origin=Origin("a")), TopK(3, 5, k=1, origin=Origin("b"))])
    with pytest.raises(ConceptsError, match="does not record its model"):
        Across([TopK(3, 4, k=1, origin=Origin("a")), TopK(3, 4, k=1)])
    across = Across([TopK(3, 4, k=1, origin=Origin("a")), TopK(3, 4, k=1, origin=Origin("b"))])
    with pytest.raises(ConceptsError, match="has no 'c'; its models are a, b"):
        across.encode(torch.zeros(2, 3), "c")
