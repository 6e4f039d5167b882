"""CIFAR-10 for everyone: `vitviz.data.cifar10_file` finds cifar10_jpeg.npz in its documented order, and
`vitviz data cifar10` makes the file in the team's copy's layout from torchvision's download, or refuses in
words without a network.

No test reaches the network: the layout is checked on a tiny stand-in for torchvision's `CIFAR10` (its `.data`,
`.targets` and `.classes`), the refusal on torchvision's real downloader pointed at a port on 127.0.0.1 that
refuses connections. The expected bytes are Pillow's own JPEG encoding at quality 75 of each picture, and the
expected order each split's labels sorted stably, both computed here."""
import io
import socket

import numpy as np
import pytest
import torchvision
from PIL import Image

from cifar10_setup import cifar10_for_tests
from vitviz import cli, data
from vitviz.data import DataError, cached_cifar10, cifar10_file, open_data, open_npz

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
LABELS = {"train": [3, 0, 9, 3, 1, 0, 9], "test": [2, 5, 2, 0, 1]}   # out of class order, with ties


def pictures(count: int, seed: int) -> np.ndarray:
    """`count` different 32x32 RGB pictures (n 32 32 3 uint8), as torchvision's `CIFAR10.data` holds them."""
    y, x = np.mgrid[0:32, 0:32]
    return np.stack([np.stack([(x * 7 + 29 * k + seed) % 256, (y * 5 + 53 * k) % 256, (x + y) * 4 % 256], -1)
                     for k in range(count)]).astype(np.uint8)


class TinyCIFAR10:
    """torchvision's `CIFAR10` as `make_cifar10` reads it, with a few pictures and no download."""
    classes = CLASSES

    def __init__(self, root: str, train: bool, download: bool):
        split = "train" if train else "test"
        self.targets = LABELS[split]
        self.data = pictures(len(self.targets), seed=int(train))


def jpeg(picture: np.ndarray) -> bytes:
    file = io.BytesIO()
    Image.fromarray(picture).save(file, "JPEG", quality=75)
    return file.getvalue()


@pytest.fixture
def places(tmp_path, monkeypatch):
    """The three places of the lookup in a temporary folder, all empty: (the variable's file, the team's copy, the
    user's cache)."""
    chosen, team, cache = (tmp_path / folder / "cifar10_jpeg.npz" for folder in ("elsewhere", "shared/data",
                                                                                  "cache/vitviz"))
    monkeypatch.delenv(data.CIFAR10_VARIABLE, raising=False)
    monkeypatch.setattr(data, "TEAM_CIFAR10", team)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return chosen, team, cache


def put(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_the_variable_beats_the_team_copy_which_beats_the_cache(places, monkeypatch):
    chosen, team, cache = places
    for path in places:
        put(path)
    monkeypatch.setenv(data.CIFAR10_VARIABLE, str(chosen))
    assert cifar10_file() == chosen
    monkeypatch.delenv(data.CIFAR10_VARIABLE)
    assert cifar10_file() == team
    team.unlink()
    assert cached_cifar10() == cache and cifar10_file() == cache


def test_the_cache_is_in_xdg_cache_home_or_else_in_home_dot_cache(places, tmp_path, monkeypatch):
    assert cached_cifar10() == tmp_path / "cache" / "vitviz" / "cifar10_jpeg.npz"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cached_cifar10() == tmp_path / "home" / ".cache" / "vitviz" / "cifar10_jpeg.npz"


def test_missing_everywhere_the_error_names_the_places_and_the_command_that_makes_it(places):
    _, team, cache = places
    with pytest.raises(DataError) as refused:
        cifar10_file()
    words = str(refused.value)
    assert "$VITVIZ_CIFAR10 (not set)" in words and str(team) in words and str(cache) in words
    assert "`vitviz data cifar10`" in words


def test_a_variable_naming_no_file_is_refused_not_passed_over(places, monkeypatch):
    chosen, team, _ = places
    put(team)
    monkeypatch.setenv(data.CIFAR10_VARIABLE, str(chosen))
    with pytest.raises(DataError, match=rf"VITVIZ_CIFAR10={chosen}: no such file.*vitviz data cifar10 --out {chosen}"):
        cifar10_file()


def test_a_command_given_data_cifar10_found_nowhere_says_how_to_make_it(places, tmp_path, capsys):
    code = cli.main(["concepts", "train", "--models", "vit-cifar10", "--data", "cifar10", "--out", str(tmp_path / "o")])
    assert code == 2 and "Make it with `vitviz data cifar10`" in capsys.readouterr().err


def test_the_command_writes_the_team_copys_layout_and_the_lookup_finds_it(places, monkeypatch, capsys):
    _, _, cache = places
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", TinyCIFAR10)
    assert cli.main(["data", "cifar10"]) == 0
    said = capsys.readouterr()
    assert f"wrote {cache}" in said.out and "--data cifar10 and the tests find it there" in said.out
    assert "train: JPEG" in said.err and "test: JPEG" in said.err   # progress
    assert sorted(p.name for p in cache.parent.iterdir()) == ["cifar10_jpeg.npz"]   # no download or partial file left

    written = np.load(cache, allow_pickle=False)
    assert sorted(written.files) == sorted(["class_names", "train_bytes", "train_offsets", "train_labels",
                                            "test_bytes", "test_offsets", "test_labels"])
    assert written["class_names"].dtype == np.dtype("<U10") and written["class_names"].tolist() == CLASSES
    for split, labels in LABELS.items():
        raw, offsets, written_labels = (written[f"{split}_{name}"] for name in ("bytes", "offsets", "labels"))
        assert raw.dtype == np.uint8 and raw.ndim == 1
        assert offsets.dtype == np.int64 and offsets.shape == (len(labels) + 1,)
        assert offsets[0] == 0 and offsets[-1] == len(raw) and (np.diff(offsets) > 0).all()
        order = sorted(range(len(labels)), key=lambda i: (labels[i], i))   # by class, the download's order within
        assert written_labels.dtype == np.uint8 and written_labels.tolist() == [labels[i] for i in order]
        source = pictures(len(labels), seed=int(split == "train"))
        assert [raw[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])] == [jpeg(source[i]) for i in order]

    test_split = open_data("cifar10", split="test")   # what --data cifar10 reads
    assert test_split.name == str(cache) and test_split.classes == tuple(CLASSES)
    assert test_split.labels == tuple(sorted(LABELS["test"])) and test_split.image(0).size == (32, 32)


def test_the_command_written_elsewhere_says_to_set_the_variable(places, tmp_path, monkeypatch, capsys):
    _, team, _ = places
    put(team)
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", TinyCIFAR10)
    out = tmp_path / "mine.npz"
    assert cli.main(["data", "cifar10", "--out", str(out)]) == 0
    assert f"set VITVIZ_CIFAR10={out} for --data cifar10 and the tests to find it" in capsys.readouterr().out
    assert open_npz(out, split="train").labels == tuple(sorted(LABELS["train"]))


@pytest.fixture
def refusing_port():
    """A port on 127.0.0.1 that refuses connections: bound, never listening, for as long as the test runs."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def test_without_a_network_the_command_refuses_in_words_and_writes_nothing(places, tmp_path, monkeypatch, capsys,
                                                                          refusing_port):
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url",
                        f"http://127.0.0.1:{refusing_port}/cifar-10-python.tar.gz")
    out = tmp_path / "made" / "cifar10_jpeg.npz"
    assert cli.main(["data", "cifar10", "--out", str(out)]) == 2
    words = capsys.readouterr().err
    assert f"Could not download CIFAR-10 from http://127.0.0.1:{refusing_port}/" in words
    assert "needs a network" in words
    assert f"copy a cifar10_jpeg.npz made elsewhere to {cached_cifar10()}" in words and "VITVIZ_CIFAR10" in words
    assert list(out.parent.iterdir()) == []   # neither the file nor the download folder


def test_out_naming_a_folder_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["data", "cifar10", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder" in capsys.readouterr().err


# ---------------------------------------------------------------- the tests' own CIFAR-10 (tests/cifar10_setup.py)

def test_the_tests_make_cifar10_on_first_use_in_the_users_cache(places, monkeypatch, capsys):
    _, _, cache = places
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", TinyCIFAR10)
    assert cifar10_for_tests() == cache
    assert f"making {cache} once" in capsys.readouterr().err
    assert open_npz(cache, split="test").labels == tuple(sorted(LABELS["test"]))
    assert cifar10_for_tests() == cache   # found the second time, not made again


@pytest.mark.parametrize("ci", [None, "1"])
def test_offline_the_tests_needing_cifar10_are_skipped_in_words_and_fail_under_ci(places, monkeypatch, refusing_port,
                                                                                   ci):
    _, _, cache = places
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", f"http://127.0.0.1:{refusing_port}/cifar-10.tar.gz")
    if ci:
        monkeypatch.setenv("CI", ci)
    else:
        monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception) as stopped:
        cifar10_for_tests()
    words = str(stopped.value)
    assert words.startswith("CI needs CIFAR-10" if ci else "needs CIFAR-10")
    assert "Make it with `vitviz data cifar10`" in words and "Making cifar10_jpeg.npz needs a network" in words
    assert not cache.exists()
