"""When concepts appear (`concepts.analysis.birth`): each concept's share of each checkpoint's variance against a
float64 numpy computation that removes the concept from the reconstruction, births on a hand-worked case, and
`concepts evaluate` of a dictionary across a run's checkpoints, trained here on a tiny run."""
import json

import numpy as np
import pytest
import torch

from tests.test_concepts_across import random_across
from vitviz.concepts.analysis.birth import BORN_FROM, FLOOR, born_at, concept_shares, existing, run_steps


def test_each_concepts_share_equals_what_removing_it_takes_from_the_reconstruction():
    across = random_across((6, 8, 5))
    g = torch.Generator().manual_seed(2)
    x = [(torch.randn(157, d, generator=g) * 2 + 1).float() for d in across.d]
    shares = concept_shares(across, x, batch_size=19)
    for m, (dictionary, tokens) in enumerate(zip(across.per_model, x)):
        tokens = tokens.double()
        with torch.no_grad():
            codes = dictionary.encode(tokens)
            whole = dictionary.decode(codes).numpy()
            spread = ((tokens - tokens.mean(0)) ** 2).sum().item()
            for c in range(across.n_concepts):
                without = codes.clone()
                without[:, c] = 0
                term = whole - dictionary.decode(without).numpy()   # the concept's own part of every token
                assert shares[m, c].item() == pytest.approx((term ** 2).sum() / spread, rel=1e-9, abs=1e-15)


def test_births_and_how_many_concepts_exist_on_a_hand_worked_run():
    steps = [0, 10, 20, 30]
    shares = torch.tensor([[0.0, 0.3, 0.5, 0.2],
                           [0.05, 0.3, 0.2, 0.2],
                           [0.2, 0.01, 0.1, 0.2],
                           [0.2, 0.3, 0.5 * FLOOR, 0.2]], dtype=torch.float64)   # checkpoints x concepts
    # concept 0 reaches half its end share at step 20; 1 dips at 20, so it is born at 30; 2 ends below the floor;
    # 3 keeps its share from the start
    assert born_at(shares, steps) == [20, 30, None, 0]
    assert existing(born_at(shares, steps), steps) == [1, 1, 2, 3]
    assert BORN_FROM == 0.5
    with pytest.raises(ValueError, match="4 checkpoints' shares for 3 steps"):
        born_at(shares, steps[:3])


def test_a_dictionary_is_a_runs_when_its_models_are_one_models_steps_in_order():
    assert run_steps(["cvt-cifar10@0", "cvt-cifar10@50", "cvt-cifar10@391"]) == [0, 50, 391]
    for models in (["cvt-cifar10@0", "vit-cifar10@50"], ["cvt-cifar10", "cvt-cifar10@50"],
                   ["cvt-cifar10@50", "cvt-cifar10@0"], ["cvt-cifar10@0"], ["a@b", "a@c"]):
        assert run_steps(models) is None


def test_concepts_evaluate_of_a_dictionary_across_a_runs_checkpoints_says_when_each_concept_was_born(
        tmp_path, cifar10_path, monkeypatch):
    from vitviz import catalog, cli
    from vitviz.train import main

    main(["--arch", "vit-micro", "--data", str(cifar10_path), "--out", str(tmp_path / "vit-cifar10"), "--epochs", "2",
          "--limit-train", "128", "--limit-test", "50", "--batch-size", "64", "--threads", "1",
          "--save-steps", "0", "1", "4"])
    monkeypatch.setattr(catalog, "CHECKPOINTS", tmp_path)   # the catalog's bundled ViT is this run
    out = tmp_path / "dictionary"
    assert cli.main(["concepts", "train", "--models", "vit-cifar10@0", "vit-cifar10@1", "vit-cifar10@4", "--block",
                     "-1", "--data", str(cifar10_path), "--limit", "64", "--epochs", "2", "--k", "4",
                     "--expansion", "2", "--out", str(out), "--cache", str(tmp_path / "cache")]) == 0
    assert cli.main(["concepts", "evaluate", str(out), "--data", str(cifar10_path), "--split", "test",
                     "--limit", "32", "--cache", str(tmp_path / "cache")]) == 0
    births = json.loads((out / "metrics.json").read_text())["births"]
    assert births["steps"] == [0, 1, 4] and len(births["share"]) == 3
    n = len(births["born_at"])
    assert n == len(births["share"][0]) and all(b in (None, 0, 1, 4) for b in births["born_at"])
    shares = np.array(births["share"])
    for c, born in enumerate(births["born_at"]):
        if born is None:
            assert shares[-1, c] < FLOOR
        else:
            at = [0, 1, 4].index(born)
            assert (shares[at:, c] >= BORN_FROM * shares[-1, c] * (1 - 1e-3)).all()
    assert births["existing"][-1] == sum(b is not None for b in births["born_at"])
