"""Items 7 and 8: the launched app (`python app.py`): its cold start against a warm request and against its floor,
the start-up imports against `import gradio, torch`, and its memory after requests over HTTP."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from timing import Timing, report, verdict
from workbench import ROOT, Bench

TARGETS = {"coldstart": 1.50, "coldstart-floor": 1.15, "import": 1.15}
APP_REQUESTS = 20       # item 8: requests over HTTP before the memory is read
WARM_REQUESTS = 5       # item 7: requests after the first, the yardstick of the cold start (2 with --quick)


def measure(bench: Bench, items: set[str]) -> None:
    """`python app.py` from process start: when the page is first served, when the first Explain (sent as soon
    as the page is) is answered, and what the next requests take; for the ImageNet pair, its memory."""
    from gradio_client import Client, handle_file

    from app_server import launch

    pairs = {"ImageNet pair (ViT-B/16 + CvT-13) from folders": bench.imagenet_pair}
    if "coldstart" in items:
        pairs[bench.bundled_pair[2]] = bench.bundled_pair[:2]
        imports = import_seconds()
        report(f"start-up imports, fresh interpreters taking turns: import app {imports['app']}, import gradio, torch "
               f"{imports['gradio, torch']}, "
               + verdict(imports["app"].median / imports["gradio, torch"].median, TARGETS["import"]))
    photo = handle_file(str(bench.jpeg))   # made before any clock starts: it takes seconds
    for what, (a, b) in pairs.items():
        memory = "memory" in items and what.startswith("ImageNet")
        requests = max(1 + (2 if bench.quick else WARM_REQUESTS), (3 if bench.quick else APP_REQUESTS) if memory else 0)
        start = time.perf_counter()
        server = launch(bench.folder("app"), "--vit", a, "--cvt", b)
        page = time.perf_counter() - start
        try:
            client = Client(server.url, verbose=False, analytics_enabled=False,
                            download_files=str(bench.folder("app-downloads")))
            connect = time.perf_counter() - start - page
            seconds = []
            for i in range(requests):
                t0 = time.perf_counter()
                client.predict(photo, a, b, api_name="/explain")
                seconds.append(time.perf_counter() - t0)
                if i == 0:
                    first = time.perf_counter() - start
            status = Path(f"/proc/{server.process.pid}/status").read_text().splitlines()
            status = dict(line.split(":", 1) for line in status)
        finally:
            server.stop()
        warm = Timing(seconds[1:])
        if "coldstart" in items:
            loaded = load_seconds((a, b))
            floor = loaded + warm.median
            report(f"cold start python app.py, {what}: first page {page:.1f} s, first answered request {first:.1f} s "
                   f"(the client's connection to the page {connect:.2f} s of it), warm requests {warm}, "
                   f"(first answer - first page) / warm request "
                   + verdict((first - page) / warm.median, TARGETS["coldstart"])
                   + f"; floor: import gradio, torch and both models loaded in a fresh process {loaded:.1f} s + one "
                     f"warm request = {floor:.1f} s, first answer / floor "
                   + verdict(first / floor, TARGETS["coldstart-floor"]))
        if memory:
            gib = {key: int(status[key].split()[0]) * 1024 / 2**30 for key in ("VmRSS", "VmHWM")}   # kB
            report(f"app memory, ImageNet pair, after {len(seconds)} requests over HTTP: RSS {gib['VmRSS']:.2f} GiB, "
                   f"peak RSS {gib['VmHWM']:.2f} GiB (requests from a client: {warm})")


def load_seconds(names) -> float:
    """Seconds from starting a fresh interpreter to both models in memory: `import gradio, torch`, then vitviz's
    `hub.load` of each (read when the process says so, not at its exit): with one warm request, the floor of
    the first answer after a start."""
    code = ("import gradio, torch\nfrom vitviz import hub\n"
            + "".join(f"hub.load({name!r}, allow_local=True)\n" for name in names) + "print('loaded', flush=True)\n")
    start = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}) as process:
        line = process.stdout.readline()
        seconds = time.perf_counter() - start
        process.wait()
    if line.strip() != "loaded":
        raise SystemExit(f"coldstart: loading {names} in a fresh process failed")
    return seconds


def import_seconds(rounds: int = 5) -> dict[str, Timing]:
    """Seconds to import the app, and its floor (gradio and torch, which it cannot start without), each in a fresh
    interpreter, the two taking turns so that a busy moment of the machine falls on both."""
    code = {"app": "import app", "gradio, torch": "import gradio, torch"}
    seconds = {name: [] for name in code}
    for _ in range(rounds):
        for name, statement in code.items():
            timed = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
            done = subprocess.run([sys.executable, "-c", timed], cwd=ROOT, capture_output=True, text=True, check=True,
                                  env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
            seconds[name].append(float(done.stdout.split()[-1]))
    return {name: Timing(values) for name, values in seconds.items()}
