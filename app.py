"""vitviz's web app, as a Space runs it: two vision transformers side by side on one image. Only the entry
lives here; the page is `vitviz.ui`.

    python app.py [--vit NAME] [--cvt NAME]     (host and port: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)
"""
from __future__ import annotations

import argparse
import os
import threading

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Agg, said before matplotlib is imported: Gradio asks for the backend around every event, and left to choose
# one matplotlib imports pyplot to find out (a second of the first answer after a start; vitviz draws with Agg)
os.environ.setdefault("MPLBACKEND", "agg")

# On a ZeroGPU Space `spaces` must be imported before torch meets CUDA: it swaps torch's CUDA for an
# emulation in this process and runs each @spaces.GPU call in a worker that holds a real GPU. gradio
# (its helpers) and vitviz import torch, so it comes first. Where it is not installed, nothing changes.
try:
    import spaces  # noqa: F401
except ImportError:
    pass

from vitviz import catalog, hub  # noqa: E402
from vitviz.files import drawing_threads  # noqa: E402
from vitviz.image import MAX_UPLOAD_BYTES  # noqa: E402
from vitviz.session import MODEL_GATE  # noqa: E402
from vitviz.ui import STYLE, build, gpu, pairs_at_hand, serving  # noqa: E402
from vitviz.video import APP_MAX_BYTES as MAX_VIDEO_BYTES  # noqa: E402


def default_pair(vit: str | None, cvt: str | None) -> tuple[str, str, str]:
    """(vit, cvt, notice): the pair named (command line, VITVIZ_VIT / VITVIZ_CVT), else the ImageNet pair when it
    can be had, else the bundled CIFAR-10 pair, said so."""
    vit, cvt = os.environ.get("VITVIZ_VIT") or vit, os.environ.get("VITVIZ_CVT") or cvt
    if vit and cvt:
        return vit, cvt, ""
    if all(hub.available(name) for name in catalog.IMAGENET_PAIR):
        return (*catalog.IMAGENET_PAIR, "")
    return (*catalog.BUNDLED_PAIR, "**Offline** (the Hugging Face Hub cannot be reached, the ImageNet models are not "
            "cached): vitviz's bundled CIFAR-10 models, 32x32 classifiers of 10 classes.")


def load_at_start(names) -> threading.Thread | None:
    """Load the page's default models as the server starts, so the first Explain finds them in memory: in the
    background, so the page is served at once (an Explain that asks for one meanwhile waits for this load).
    On ZeroGPU in this thread, before launch: its CUDA emulation sees only this thread's tensors, and what is
    on 'cuda' at launch is what it moves to the GPU of every worker."""
    gpu.STARTING.update(names)
    if gpu.ZERO_GPU:
        gpu.place(names)
        return None
    loading = threading.Thread(target=gpu.place, args=(names,), daemon=True, name="vitviz-load-defaults")
    loading.start()
    return loading


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vit", help="left model (catalog name, Hub id, or a local folder you allow)")
    p.add_argument("--cvt", help="right model")
    args = p.parse_args(argv)
    gpu.LOCAL_ALLOWED.update(name for name in (args.vit, args.cvt) if name)
    serving.fewer_malloc_arenas()
    drawing_threads()   # for the process: requests draw on threads of their own
    vit, cvt, notice = default_pair(args.vit, args.cvt)
    load_at_start((vit, cvt))
    demo = build(vit, cvt, notice, pairs_at_hand())
    serving.sweep_files(demo, age=serving.FILE_TTL)
    demo.queue(default_concurrency_limit=MODEL_GATE.slots, max_size=serving.QUEUE)
    # uploads above the image limit are videos' (read_image refuses an image above its own limit in words)
    # the concept atlas under /atlas where one is built (VITVIZ_ATLAS, else checkpoints/atlas: `vitviz atlas`)
    demo.launch(max_file_size=max(MAX_UPLOAD_BYTES, MAX_VIDEO_BYTES), show_error=True, css=STYLE,
                app_kwargs=serving.atlas_routes())


if __name__ == "__main__":
    main()
