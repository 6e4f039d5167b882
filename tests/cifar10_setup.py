"""CIFAR-10 for the tests: found where vitviz finds it, made on first use where it is missing, and otherwise the
tests that need it skipped in words (failed under CI, which must never pass without the data)."""
import contextlib
import os
import socket
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from vitviz.data import DataError, cached_cifar10, cifar10_file, make_cifar10

DOWNLOAD_TIMEOUT = 60   # seconds a stalled connection may stay silent: torchvision's download sets no limit


def cifar10_for_tests(shown: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> Path:
    """cifar10_jpeg.npz where `vitviz.data.cifar10_file` finds it ($VITVIZ_CIFAR10, ../shared/data/ beside the
    repository, the user's cache). Where it is in none, it is made in the user's cache by the code of `vitviz data
    cifar10`, with a line saying so and the download's and the encoding's progress bars on stderr, inside `shown()`
    (pytest's capture lifted). Where that fails (no network), `pytest.skip` with both reasons, or `pytest.fail`
    under CI (`CI` set)."""
    try:
        return cifar10_file()
    except DataError as missing:
        with shown():
            print(f"\nCIFAR-10 is in none of the places vitviz looks: making {cached_cifar10()} once (downloads "
                  f"about 170 MB, then encodes 60,000 JPEGs in about a minute)", file=sys.stderr)
            try:
                with socket_timeout(DOWNLOAD_TIMEOUT):
                    return make_cifar10(cached_cifar10())
            except DataError as offline:
                reason = f"{missing}\n{offline}"
    if os.environ.get("CI"):
        pytest.fail(f"CI needs CIFAR-10: {reason}", pytrace=False)
    pytest.skip(f"needs CIFAR-10: {reason}")


@contextlib.contextmanager
def socket_timeout(seconds: float):
    """Sockets opened meanwhile give up after `seconds` of silence, where a firewall drops packets instead of
    refusing them."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)
