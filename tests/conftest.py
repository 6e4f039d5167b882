"""Test-wide setup: huggingface_hub talks to a local fake Hub and keeps its cache in a temporary folder.

huggingface_hub reads HF_ENDPOINT and HF_HOME once, when it is imported, so both are set here,
before any test module imports it: the fake Hub's socket is bound now (its port goes into
HF_ENDPOINT) and it starts answering when a test asks for the `hub` fixture. No test reaches the
real Hub or touches ~/.cache/huggingface; offline mode and tokens from the shell are cleared. Pictures the app
draws on request are kept in a folder of each test's own (`drawn_pictures`), so no test finds another's.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from hub_server import FakeHub

HF_HOME = tempfile.mkdtemp(prefix="vitviz-tests-hf-")
HUB = FakeHub()

if "huggingface_hub" in sys.modules:
    raise RuntimeError("huggingface_hub was imported before tests/conftest.py could point it at the fake Hub")
for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN",
                 "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
    os.environ.pop(variable, None)
os.environ.update(HF_HOME=HF_HOME, HF_ENDPOINT=HUB.url, HF_HUB_DISABLE_TELEMETRY="1",
                  VITVIZ_PICTURES=tempfile.mkdtemp(prefix="vitviz-tests-pictures-"))   # app servers' drawn pictures


@pytest.fixture(autouse=True)
def drawn_pictures(tmp_path_factory, monkeypatch) -> Path:
    """The folder the app keeps pictures drawn on request in (`vitviz.ui.drawn`), new for each test."""
    folder = tmp_path_factory.mktemp("drawn-pictures")
    monkeypatch.setenv("VITVIZ_PICTURES", str(folder))
    return folder


@pytest.fixture(scope="session")
def cifar10_path(pytestconfig) -> Path:
    """cifar10_jpeg.npz, found, or made in the user's cache on first use (with the network), or else the test skipped
    in words (failed under CI): `cifar10_setup.cifar10_for_tests`."""
    from cifar10_setup import cifar10_for_tests

    return cifar10_for_tests(pytestconfig.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled)


@pytest.fixture(scope="session")
def cifar10_test(cifar10_path):
    """CIFAR-10's test split, from cifar10_jpeg.npz."""
    from vitviz.data import open_data

    return open_data(cifar10_path, split="test")


@pytest.fixture(scope="session")
def hub() -> FakeHub:
    """The fake Hub, answering on HF_ENDPOINT; repos published to it stay for the session."""
    return HUB.start()


def pytest_sessionfinish(session, exitstatus):
    HUB.stop()
    shutil.rmtree(HF_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small models on a shared 2-core machine: a second intra-op thread mostly spin-waits for a busy core."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def own_caches(tmp_path, monkeypatch):
    """A fresh HF cache folder (huggingface_hub reads HF_HUB_CACHE at each call) and no loaded models."""
    from huggingface_hub import constants

    from vitviz import hub
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    hub.clear_cache()
    yield
    hub.clear_cache()


@pytest.fixture(scope="session")
def dinov2_repos(hub, tmp_path_factory) -> dict:
    """Small DINOv2 checkpoints, without and with registers, in timm's Hub layout on the fake Hub under the
    catalog's repo ids: catalog name -> (repo id, the timm model, in eval mode)."""
    from hub_server import files_of, timm_checkpoint
    from vitviz import catalog

    repos = {}
    for name in ("dinov2-s14", "dinov2-s14-reg4"):
        folder = tmp_path_factory.mktemp(name)
        source = catalog.CATALOG[name].source
        reference = timm_checkpoint(folder, source.removeprefix("timm/"), depth=2, embed_dim=48, num_heads=6)
        hub.publish(source, files_of(folder))
        repos[name] = (source, reference.eval())
    return repos


@pytest.fixture(scope="module")
def bundled_app(tmp_path_factory):
    """The app, launched offline with the bundled pair (a module's own server)."""
    from tests.app_server import launch
    from vitviz.catalog import BUNDLED_PAIR

    server = launch(tmp_path_factory.mktemp("bundled-app"), "--vit", BUNDLED_PAIR[0], "--cvt", BUNDLED_PAIR[1])
    yield server
    server.stop()
