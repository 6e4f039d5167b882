"""vitviz.concepts.analysis.match: two dictionaries' concept maps correlated at aligned cells, and matched one to one.

References: numpy's corrcoef on the stacked rows, a brute force over every one-to-one assignment, a
hand-worked matrix where the greedy choice is wrong, a dictionary matched with a permuted copy of itself,
and the cells of a 8 x 8 and a 4 x 4 grid over the same crop made by 2 x 2 average pooling.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitviz import hub
from vitviz.concepts import ConceptsError, Origin, TopK
from vitviz.concepts.activations.cache import block_tokens
from vitviz.concepts.analysis.match import MATCHES_FILE, MATRIX_FILE, Correlation, Matches, Side, assignment, match

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data(cifar10_test):
    return cifar10_test


def random_dictionary(d: int, n: int, *, k: int, seed: int, origin: Origin | None = None) -> TopK:
    g = torch.Generator().manual_seed(seed)
    dictionary = TopK(d, n, k=k, origin=origin or Origin())
    with torch.no_grad():
        dictionary.W_enc.copy_(torch.randn(d, n, generator=g))
        rows = torch.randn(n, d, generator=g)
        dictionary.W_dec.copy_(rows / rows.norm(dim=1, keepdim=True))
    return dictionary.eval()


def permuted(dictionary: TopK, order: torch.Tensor) -> TopK:
    """The same dictionary with its concepts renumbered: concept j of the copy is concept order[j]."""
    copy = TopK(dictionary.d, dictionary.n_concepts, k=dictionary.k, origin=dictionary.origin)
    with torch.no_grad():
        copy.W_enc.copy_(dictionary.W_enc[:, order])
        copy.b_enc.copy_(dictionary.b_enc[order])
        copy.W_dec.copy_(dictionary.W_dec[order])
        copy.b_dec.copy_(dictionary.b_dec)
    return copy.eval()


def test_the_streamed_correlation_equals_numpys_corrcoef_on_the_stacked_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.relu(torch.randn(600, 7, generator=g, dtype=torch.float64)) * (torch.rand(600, 7, generator=g) < 0.3)
    y = 0.5 * x[:, :5] + torch.relu(torch.randn(600, 5, generator=g, dtype=torch.float64))
    x[:, 2] += 1e7           # a large mean: the shift keeps the digits of its spread
    x[:, 5] = 0.0            # never fires
    y[:, 4] = 0.1            # constant, its mean inexact in binary
    streamed = Correlation(7, 5)
    for start, stop in [(0, 3), (3, 130), (130, 131), (131, 600)]:   # the first batch's mean of 0.1 is inexact
        streamed.add(x[start:stop], y[start:stop])
    varies_x, varies_y = streamed.varies()
    assert varies_x.tolist() == [True] * 5 + [False, True] and varies_y.tolist() == [True] * 4 + [False]
    reference = np.corrcoef(x[:, varies_x].numpy(), y[:, varies_y].numpy(), rowvar=False)[:6, 6:]
    matrix = streamed.matrix()
    np.testing.assert_allclose(matrix[varies_x][:, varies_y].numpy(), reference, atol=1e-9)
    assert (matrix[5] == 0).all() and (matrix[:, 4] == 0).all()


def test_the_assignment_is_the_best_one_to_one_pairing_not_the_greedy_one():
    matrix = torch.tensor([[0.9, 0.8, 0.0],
                           [0.85, 0.0, 0.0],
                           [0.0, 0.0, 0.5]], dtype=torch.float64)
    pairs, values = assignment(matrix)   # greedy takes 0.9 and is left with 0 + 0.5; the best is 0.85 + 0.8 + 0.5
    assert pairs.tolist() == [[1, 0], [0, 1], [2, 2]] and values.tolist() == [0.85, 0.8, 0.5]


def test_the_assignment_equals_a_brute_force_over_every_pairing_among_the_allowed_concepts():
    g = torch.Generator().manual_seed(1)
    matrix = torch.rand(6, 8, generator=g, dtype=torch.float64) * 2 - 1
    rows = torch.tensor([True, True, False, True, True, True])
    columns = torch.tensor([True, False, True, True, True, True, True, False])
    pairs, values = assignment(matrix, rows=rows, columns=columns)
    row_ids, column_ids = rows.nonzero()[:, 0].tolist(), columns.nonzero()[:, 0].tolist()
    best = max(itertools.permutations(column_ids, len(row_ids)),
               key=lambda chosen: sum(matrix[r, c].item() for r, c in zip(row_ids, chosen)))
    assert sorted(map(tuple, pairs.tolist())) == sorted(zip(row_ids, best))
    assert values.tolist() == sorted(values.tolist(), reverse=True)
    assert values.tolist() == [matrix[a, b].item() for a, b in pairs.tolist()]


def test_a_dictionary_matched_with_its_permuted_copy_recovers_the_permutation(data):
    vit = hub.load("vit-cifar10")
    dictionary = random_dictionary(192, 96, k=8, seed=2, origin=Origin(model="vit-cifar10", block=5, tokens="patch"))
    order = torch.randperm(96, generator=torch.Generator().manual_seed(3))
    matches = match(Side(vit, dictionary), Side(vit, permuted(dictionary, order)), data, indices=range(12),
                    batch_size=5, progress=False)
    fired = matches.firing[0] * matches.rows
    assert matches.rows == 12 * 64 and matches.images == 12
    assert torch.equal(matches.firing[0][order], matches.firing[1])
    assert len(matches.pairs) == int((fired >= matches.min_rows).sum()) > 40
    assert torch.equal(order[matches.pairs[:, 1]], matches.pairs[:, 0])
    torch.testing.assert_close(matches.correlation, torch.ones_like(matches.correlation), rtol=0, atol=1e-6)
    a, b = matches.pairs[0].tolist()
    assert matches.partner(a, side=0) == (b, float(matches.correlation[0]))
    assert matches.partner(b, side=1) == (a, float(matches.correlation[0]))
    assert matches.partner(int(fired.argmin()), side=0) is None


def test_the_correlation_at_aligned_cells_equals_corrcoef_of_pooled_concept_maps(data):
    vit, cvt = hub.load("vit-cifar10"), hub.load("cvt-cifar10")
    a = random_dictionary(192, 24, k=6, seed=4)
    b = random_dictionary(192, 20, k=5, seed=5)
    indices = list(range(10))
    matches = match(Side(vit, a, block=5), Side(cvt, b, block=-1), data, indices=indices, batch_size=4,
                    min_rows=3, progress=False)
    rows_a, rows_b = [], []
    for i in indices:
        with torch.inference_mode():
            codes_a = a.encode(block_tokens(vit.model.trace(vit.preprocess(data.image(i))), 5, "patch"))
            codes_b = b.encode(block_tokens(cvt.model.trace(cvt.preprocess(data.image(i))), -1, "patch"))
        # both crops are the whole 32 x 32 image: ViT's 8 x 8 tokens are 4 px, CvT's last 4 x 4 are 8 px
        pooled = F.avg_pool2d(codes_a.reshape(1, 8, 8, 24).permute(0, 3, 1, 2), 2).permute(0, 2, 3, 1)
        rows_a.append(pooled.reshape(16, 24))
        rows_b.append(codes_b.reshape(16, 20))
    x, y = torch.cat(rows_a).double().numpy(), torch.cat(rows_b).double().numpy()
    varies_a, varies_b = x.std(0) > 0, y.std(0) > 0
    reference = np.corrcoef(x[:, varies_a], y[:, varies_b], rowvar=False)[:varies_a.sum(), varies_a.sum():]
    assert matches.rows == 160 and matches.matrix.shape == (24, 20)
    np.testing.assert_allclose(matches.matrix.numpy()[varies_a][:, varies_b], reference, atol=1e-6)
    assert (matches.matrix.numpy()[~varies_a] == 0).all() and (matches.matrix.numpy()[:, ~varies_b] == 0).all()
    np.testing.assert_allclose(matches.firing[0].numpy(), (x > 0).mean(0))
    allowed_a, allowed_b = (x > 0).sum(0) >= 3, (y > 0).sum(0) >= 3
    assert len(matches.pairs) == min(allowed_a.sum(), allowed_b.sum())
    assert allowed_a[matches.pairs[:, 0]].all() and allowed_b[matches.pairs[:, 1]].all()
    described = matches.sides
    assert [(s["model"], s["block"], s["tokens"]) for s in described] == [("vit-cifar10", 5, "patch"),
                                                                         ("cvt-cifar10", 8, "patch")]


def test_matches_save_and_load_back_and_a_damaged_file_is_refused_in_words(data, tmp_path):
    resnet = hub.load("resnet-cifar10")
    matches = match(Side(resnet, random_dictionary(128, 32, k=4, seed=6), block=-1),
                    Side(resnet, random_dictionary(128, 40, k=4, seed=7), block=-1), data, indices=range(4),
                    progress=False)
    folder = matches.save(tmp_path / "matches")
    back = Matches.load(folder)
    assert torch.equal(back.pairs, matches.pairs) and torch.equal(back.correlation, matches.correlation)
    assert torch.equal(back.matrix, matches.matrix) and all(map(torch.equal, back.firing, matches.firing))
    assert (back.sides, back.rows, back.images, back.skipped, back.min_rows) == \
        (matches.sides, matches.rows, matches.images, matches.skipped, matches.min_rows)
    saved = json.loads((folder / MATCHES_FILE).read_text())
    assert saved["pairs"][0] == [int(matches.pairs[0, 0]), int(matches.pairs[0, 1]), float(matches.correlation[0])]

    (folder / MATRIX_FILE).write_bytes(b"\x10" * 20)
    with pytest.raises(ConceptsError, match=r"correlations.safetensors is damaged"):
        Matches.load(folder)
    (folder / MATRIX_FILE).unlink()
    assert Matches.load(folder).matrix is None
    (folder / MATCHES_FILE).write_text(json.dumps({**saved, "pairs": [[1, 2]]}))
    with pytest.raises(ConceptsError, match=r"matches.json is damaged or not in the layout vitviz writes"):
        Matches.load(folder)
    (folder / MATCHES_FILE).write_text(json.dumps({**saved, "version": 99}))
    with pytest.raises(ConceptsError, match=r"newer vitviz"):
        Matches.load(folder)
    with pytest.raises(ConceptsError, match=r"holds no matches.json"):
        Matches.load(tmp_path)


def test_a_class_token_dictionary_or_one_of_another_model_is_refused_in_words(data):
    vit = hub.load("vit-cifar10")
    patch = random_dictionary(192, 16, k=2, seed=8)
    cls = random_dictionary(192, 16, k=2, seed=8, origin=Origin(model="vit-cifar10", block=6, tokens="cls"))
    with pytest.raises(ConceptsError, match=r"reads the class token alone, which has no place on the photo"):
        match(Side(vit, patch, block=6), Side(vit, cls), data, indices=range(2), progress=False)
    other = random_dictionary(192, 16, k=2, seed=8, origin=Origin(model="cvt-cifar10", block=8, tokens="patch"))
    with pytest.raises(ConceptsError, match=r"trained on cvt-cifar10 block 9 \(index 8\), patch tokens, "
                                                r"not on vit-cifar10"):
        match(Side(vit, patch, block=6), Side(vit, other, block=6), data, indices=range(2), progress=False)
