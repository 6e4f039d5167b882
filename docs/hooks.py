"""MkDocs hook: the CKA heatmaps `vitviz compare` wrote into `checkpoints/compare-*/` are published under the same
paths on the site, so the pages show them without a copy of the files in docs/."""
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent


def on_files(files, config):
    for png in sorted((ROOT / "checkpoints").glob("compare-*/*/*.png")):
        files.append(File.generated(config, png.relative_to(ROOT).as_posix(), abs_src_path=str(png)))
    return files
