"""Keeping a long-running server healthy: its queue's bound, the files it hands out swept once old, and a
flat memory footprint; and the static concept atlas served beside the app, where it is built."""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from pathlib import Path

import gradio as gr

from .. import catalog

# seconds an upload, a drawn view or a zip stays in Gradio's cache folder before it is deleted
FILE_TTL = int(os.environ.get("VITVIZ_FILE_TTL", "3600"))
# requests that may wait in the queue (Gradio 6.31 allows one on a ZeroGPU Space unless told: a second visitor
# would be turned away)
QUEUE = int(os.environ.get("VITVIZ_QUEUE", "256"))


def sweep_files(demo: gr.Blocks, *, age: float) -> None:
    """Every age/4 s, delete the files this app put in Gradio's cache folder (uploads, drawn views, zips)
    once they are `age` s old; the example photos stay. Gradio's own `delete_cache` does the same, but its
    sweeper stops for good the first time a request adds a file while it sweeps ('Set changed size during
    iteration', Gradio 6.31); this one sweeps copies of the file lists."""
    def sweep_forever():
        while True:
            time.sleep(age / 4)
            keep = set().union(*(getattr(block, "keep_in_cache", set()) for block in demo.blocks.values()))
            for files in demo.temp_file_sets:   # Gradio's record of what this app wrote
                for path in files.copy() - keep:
                    try:
                        if time.time() - os.lstat(path).st_ctime < age:
                            continue
                        os.remove(path)
                    except FileNotFoundError:
                        pass
                    except OSError:   # not ours to delete after all: try again next time
                        continue
                    files.discard(path)
                    with contextlib.suppress(OSError):   # the folder Gradio made for it, unless another file is there
                        os.rmdir(os.path.dirname(path))

    threading.Thread(target=sweep_forever, daemon=True, name="vitviz-sweep-files").start()


def fewer_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread its own heap (up to 8 per core) and never reuses memory freed in one for
    another: with Gradio's worker threads loading, evicting and reloading models, the server's RSS kept
    growing (by ~200 MB over 300 requests). Two heaps keep it flat, as MALLOC_ARENA_MAX=2 does, which
    wins if set. Without glibc (macOS, Windows, musl) this does nothing."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, arenas)   # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        pass


ATLAS_PATH = "/atlas"   # where the app serves the concept atlas


def atlas_folder() -> Path:
    """Where the app finds the concept atlas it serves: the folder VITVIZ_ATLAS names, else checkpoints/atlas."""
    return Path(os.environ.get("VITVIZ_ATLAS") or catalog.ATLAS)


def atlas_page(source: str, concept: int) -> str | None:
    """The address under which the app serves concept `concept` of the dictionary `source`'s page, where the
    atlas it serves has one; None otherwise."""
    from ..atlas.facts import slug_of
    from ..atlas.pages import concept_path

    relative = concept_path(slug_of(source), concept)
    return f"{ATLAS_PATH}/{relative}" if (atlas_folder() / relative).is_file() else None


def atlas_routes(folder: str | Path | None = None) -> dict:
    """The keyword arguments of the app's FastAPI server (`launch(app_kwargs=...)`) that serve the concept atlas
    built in `folder` (`atlas_folder()` by default) under /atlas (its front page at /atlas/), or none where no
    atlas is built there. Given when the server is made, the route comes before Gradio's own."""
    folder = atlas_folder() if folder is None else Path(folder)
    if not (folder / "index.html").is_file():
        return {}
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    return {"routes": [Mount(ATLAS_PATH, app=StaticFiles(directory=folder, html=True), name="atlas")]}
