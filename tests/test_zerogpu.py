"""The app on ZeroGPU, end to end, on this CPU-only machine: spaces' own machinery (a forked worker per GPU
function, arguments and results pickled across, warm workers reused, progress and errors relayed) runs
the app's GPU functions, with a loopback stand-in for the device scheduler (tests/zerogpu.py) and only
the CUDA-bound steps made harmless (tests/zerogpu_app.py). Everything a client can call must answer as it
does off ZeroGPU: the same pictures, the same arrays, the same sentences.

This depends on spaces' internals (`spaces.zero.torch`'s unpatch/init/move, the device API's routes):
spaces stays pinned in requirements-dev.txt, and a new spaces release is checked here before the pin moves.
"""
import contextlib
import json
import os
import signal
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app_server import ROOT, launch
from zerogpu import Scheduler

pytestmark = pytest.mark.slow

PHOTO = ROOT / "assets" / "cat_chelsea.jpg"
PAIR = ("vit-cifar10", "cvt-cifar10")


@pytest.fixture(scope="module")
def scheduler():
    scheduler = Scheduler()
    yield scheduler
    scheduler.close()


@pytest.fixture(scope="module")
def zero_server(tmp_path_factory, scheduler):
    tmp = tmp_path_factory.mktemp("zerogpu")
    server = launch(tmp, script=ROOT / "tests" / "zerogpu_app.py", env={
        "SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": scheduler.url,
        "ZEROGPU_OFFLOAD_DIR": str(tmp / "offload"), "VITVIZ_TEST_SLOW_FILE": str(tmp / "slow")})
    server.slow = tmp / "slow"
    yield server
    left = workers(server)   # spaces' daemon workers outlive a terminated app: end them with it
    server.stop()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory):
    server = launch(tmp_path_factory.mktemp("plain"))
    yield server
    server.stop()


def connect(server, tmp: Path):
    from gradio_client import Client
    return Client(server.url, verbose=False, analytics_enabled=False, download_files=str(tmp))


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def flatten(answer) -> list:
    """An answer's values in order, galleries and labels opened up: file paths, texts, numbers."""
    values = []
    for value in answer if isinstance(answer, (tuple, list)) else [answer]:
        if isinstance(value, list):
            for item in value:   # a gallery's items: (picture, caption)
                picture = item["image"] if isinstance(item, dict) and "image" in item else item
                values += flatten([picture["path"] if isinstance(picture, dict) else picture,
                                   item.get("caption") if isinstance(item, dict) else None])
        elif isinstance(value, dict) and isinstance(value.get("video"), dict):   # a video: its file
            values.append(value["video"]["path"])
        elif isinstance(value, dict) and "confidences" in value:
            values.append(json.dumps(value, sort_keys=True))
        elif isinstance(value, dict) and "value" in value:   # a component update (a slider's range)
            values.append(json.dumps({k: value.get(k) for k in ("minimum", "maximum", "value")}))
        else:
            values.append(value)
    return values


def same(a, b) -> bool:
    """Two answers show the same: every text equal, every picture the same pixels (JPEG of equal arrays),
    every zip the same files and maps."""
    a, b = flatten(a), flatten(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, str) and x.startswith("/") and Path(x).is_file():
            if x.endswith(".zip"):
                if not same_zips(x, y):
                    return False
            elif x.endswith(".mp4"):
                if not same_videos(x, y):
                    return False
            elif pixels(x).shape != pixels(y).shape or np.abs(pixels(x) - pixels(y)).mean() > 0.5:
                return False
        elif x != y:
            return False
    return True


def same_zips(a, b) -> bool:
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        if sorted(za.namelist()) != sorted(zb.namelist()):
            return False
        for name in za.namelist():
            if name.endswith(".npy"):
                x, y = (np.load(z.open(name), allow_pickle=False) for z in (za, zb))
                if not np.allclose(x, y, rtol=1e-5, atol=1e-7):
                    return False
    return True


def same_videos(a, b) -> bool:
    """Two videos of the same frames: as many, the same size, each within one grey level on average."""
    import av
    with av.open(a) as va, av.open(b) as vb:
        frames = [[f.to_ndarray(format="rgb24").astype(int) for f in v.decode(video=0)] for v in (va, vb)]
    return len(frames[0]) == len(frames[1]) and all(
        x.shape == y.shape and np.abs(x - y).mean() <= 1.0 for x, y in zip(*frames))


def every_call():
    """Every documented endpoint after an Explain, as a client calls it: (api name, arguments)."""
    from vitviz.explain import METHODS
    calls = [("/render_tokens", ()), ("/render_registers", ()), ("/render_maps", ("inferno", "nearest", "mask", True)),
             ("/render_layers", (2, 1, 3, 0, "row")), ("/render_heads", (3, 4, "cls", True, 0.6, "outline")),
             ("/render_model_view", ("cls", False, 0.6, "outline")), ("/render_norms", (3, 4)),
             ("/render_stages", ()), ("/render_features", ()), ("/render_anatomy", ())]
    calls += [("/render_gradients", (m.name, None, None)) for m in METHODS.values() if m.targeted]
    calls += [("/render_gradients", ("chefer", 3, 5)), ("/render_faithfulness", ("rollout", 4)),
              ("/render_faithfulness", ("legrad", 4)), ("/download", (["rollout", "chefer", "attnlrp"], True))]
    from gradio_client import handle_file
    photos = [handle_file(str(p)) for p in sorted((ROOT / "assets").glob("*.jpg"))]   # 8: CKA's least
    calls += [("/render_lens", ()), ("/render_lens_layer", (3, 5)), ("/render_residual", ()),
              ("/render_cka", (*PAIR, "cls")), ("/compute_cka", (*PAIR, "mean", photos))]
    calls += [("/render_decide", ()), ("/patch_plan", (4,)), ("/patch", ("noise", None, 4)),
              ("/patch", ("upload", photos[1], 4))]
    calls += [("/render_windows", (1, 2)), ("/render_biases", (1, 1)), ("/render_reach", ()),
              ("/render_reach_layer", (2, 3))]
    clip = handle_file(str(ROOT / "assets" / "horse_pan_zoom.mp4"))
    calls += [("/explain_video", (clip, *PAIR, ["rollout", "chefer"], 4))]
    calls += [("/circuit", ("", "", "zero", "atp", False, 0.8))]
    calls += [("/looks", (["vit-cifar10"], "unit", 2, 5, "", "maco", 4, 0))]
    calls += [("/render_training", ()), ("/move_training", (*PAIR, 0.5))]
    return calls


def test_every_endpoint_answers_on_zerogpu_as_it_does_off_it(zero_server, plain_server, scheduler, tmp_path):
    from gradio_client import handle_file
    zero, plain = connect(zero_server, tmp_path / "zero"), connect(plain_server, tmp_path / "plain")
    answers = [client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain") for client in (zero, plain)]
    assert len(json.loads(flatten(answers[0])[0])["confidences"]) == 5
    assert same(*answers), "/explain"
    for name, args in every_call():
        assert same(zero.predict(*args, api_name=name), plain.predict(*args, api_name=name)), name
    # the model passes ran in spaces' workers, each granted by the scheduler and released
    assert scheduler.count("/schedule") >= 2 + len(every_call()) // 4
    assert scheduler.count("/release") == scheduler.count("/schedule")


def refusal(client, *args, api_name: str) -> str:
    from gradio_client.exceptions import AppError
    with pytest.raises(AppError) as error:
        client.predict(*args, api_name=api_name)
    return str(error.value)


def test_a_bad_image_an_unknown_model_and_a_missing_class_get_the_same_sentences(zero_server, plain_server, tmp_path):
    from gradio_client import handle_file
    page = tmp_path / "page.jpg"
    page.write_text("<!doctype html><html><body>not a photo</body></html>")
    heard = []
    for server in (zero_server, plain_server):
        client = connect(server, tmp_path / server.url.split(":")[-1].strip("/"))
        said = [refusal(client, handle_file(str(page)), *PAIR, api_name="/explain"),
                refusal(client, handle_file(str(PHOTO)), "no-such-model", PAIR[1], api_name="/explain")]
        client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
        said.append(refusal(client, "chefer", 12, None, api_name="/render_gradients"))
        heard.append(said)
    assert heard[0] == heard[1]
    assert "not an image" in heard[0][0] and "'no-such-model' is not a model vitviz can load" in heard[0][1]
    assert "target class 12 is not one of the model's 10 classes" in heard[0][2]


def workers(server) -> list[int]:
    """The app's child processes: spaces' forked GPU workers."""
    pid = server.process.pid
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def test_a_worker_killed_during_a_call_gives_a_sentence_and_the_next_call_works(zero_server, tmp_path):
    from gradio_client import handle_file
    client = connect(zero_server, tmp_path)
    client.predict(handle_file(str(PHOTO)), *PAIR, api_name="/explain")
    client.predict("rollout", 4, api_name="/render_faithfulness")   # the faithfulness worker is warm
    zero_server.slow.touch()   # its next call sleeps first, so it is still running when its worker dies
    try:
        job = client.submit("rollout", 5, api_name="/render_faithfulness")
        before = set(workers(zero_server))
        threading.Event().wait(2)
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        from gradio_client.exceptions import AppError
        with pytest.raises(AppError, match="GPU task aborted"):
            job.result(timeout=60)
    finally:
        zero_server.slow.unlink()
    plots = client.predict("rollout", 6, api_name="/render_faithfulness")
    assert all(pixels(plot).shape[2] == 3 for plot in plots)
    assert not set(workers(zero_server)) & before   # new workers took the dead ones' place


def test_two_clients_at_once_are_both_served_and_warm_workers_are_reused(zero_server, tmp_path):
    from gradio_client import handle_file
    clients = [connect(zero_server, tmp_path / str(k)) for k in range(2)]
    jobs = [c.submit(handle_file(str(PHOTO)), *PAIR, api_name="/explain") for c in clients]
    answers = [job.result(timeout=120) for job in jobs]
    assert all(len(json.loads(flatten(a)[0])["confidences"]) == 5 for a in answers)
    for client in clients:
        client.predict("grad-rollout", None, None, api_name="/render_gradients")
    # one warm worker per GPU function at most (trace, class maps, faithfulness), not one per call
    assert len(workers(zero_server)) <= 3
