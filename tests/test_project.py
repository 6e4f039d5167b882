"""The project's own promises: the README is a front page (two screens, its commands the ones CI runs, its links
reaching pages and headings of the documentation site), and its front matter (the Space's configuration) builds
the Space as it was tested: the Gradio the tests ran, the catalog's models, and the default pair's files
preloaded, those and no others."""
import re
import sys
from pathlib import Path

import gradio
import markdown
import yaml
from huggingface_hub import SpaceHardware, constants as hf_constants, hf_hub_download, metadata_load

import vitviz
from hub_server import cvt_checkpoint, files_of, timm_checkpoint
from vitviz import catalog, hub as vhub

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 250   # two screens: what a newcomer reads before the site takes over
# What the default pair's repos hold on the Hub (their "Files and versions" pages, at
# huggingface.co/timm/vit_base_patch16_224.augreg2_in21k_ft_in1k/tree/3feba41 and
# huggingface.co/microsoft/cvt-13/tree/b71e71d; cvt-13's model.safetensors is only on refs/pr/2).
HUB_FILES = {
    "vit-base": ["README.md", "config.json", "model.safetensors", "pytorch_model.bin"],
    "cvt-13": ["README.md", "config.json", "preprocessor_config.json", "pytorch_model.bin", "tf_model.h5"],
}
SHORT_DESCRIPTION_MAX = 60   # the Hub refuses a longer one: '"short_description" length must be ... <= 60'


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README.read_text())


def front_matter() -> dict:
    """README.md's YAML header, read as huggingface_hub reads a repo card's."""
    return metadata_load(README)


def site_pages() -> list[str]:
    """The pages of the documentation site, as mkdocs.yml's nav lists them (paths inside docs/)."""
    def pages(entries) -> list[str]:
        found = []
        for entry in entries:
            values = entry.values() if isinstance(entry, dict) else [entry]
            for value in values:
                found += pages(value) if isinstance(value, list) else [value]
        return found
    return pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])


def heading_ids(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings: Python-Markdown's toc extension, which MkDocs runs, on the page
    (fenced code kept out, so a `# comment` in a code block is no heading)."""
    md = markdown.Markdown(extensions=["toc", "attr_list", "fenced_code", "tables"])
    md.convert(page.read_text())

    def ids(tokens):
        for token in tokens:
            yield token["id"]
            yield from ids(token["children"])
    return set(ids(md.toc_tokens))


def test_the_readme_fits_on_two_screens():
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_every_link_from_the_readme_into_the_site_reaches_one_of_its_pages_and_headings():
    links = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#([^)\s]+))?\)", README.read_text())
    pages = set(site_pages())
    assert {"index.md", "getting-started.md", "app.md"} <= {target.removeprefix("docs/") for target, _ in links}
    unknown = [target for target, _ in links if target.removeprefix("docs/") not in pages]
    missing = [f"{target}#{anchor}" for target, anchor in links
               if anchor and target.removeprefix("docs/") in pages and anchor not in heading_ids(ROOT / target)]
    assert (unknown, missing) == ([], [])


def test_the_pictures_the_readme_shows_are_in_the_repository():
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README.read_text())
    assert "docs/images/first-screen.png" in pictures
    assert [p for p in pictures if not (ROOT / p).is_file()] == []


def test_readme_has_exactly_two_setup_commands_one_for_the_app_and_one_for_the_tests():
    setup = readme_commands()[:2]
    assert len(setup) == 2
    assert setup[0].endswith("app.py") and "requirements.txt" in setup[0]
    assert "pytest" in setup[1] and "requirements-dev.txt" in setup[1]


def test_ci_runs_the_readmes_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_space_front_matter_lists_the_catalogs_hub_repos():
    front = front_matter()
    assert front["models"] == [e.source for e in catalog.CATALOG.values() if not e.bundled]
    assert (front["sdk"], front["app_file"]) == ("gradio", "app.py")


def test_the_space_installs_the_gradio_and_python_the_tests_ran_with():
    front = front_matter()
    pinned = re.findall(r"^gradio==(\S+)$", (ROOT / "requirements.txt").read_text(), flags=re.M)
    assert front["sdk_version"] == gradio.__version__ and pinned == [gradio.__version__]
    assert front["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_space_card_names_hardware_the_hub_has_and_a_description_it_accepts():
    front = front_matter()
    assert front["suggested_hardware"] in {h.value for h in SpaceHardware}
    assert 0 < len(front["short_description"]) <= SHORT_DESCRIPTION_MAX


def test_the_preloaded_files_are_all_the_default_pair_needs_offline_and_each_is_read(hub, tmp_path, monkeypatch):
    """A Space downloads `preload_from_hub` at build time ("repo file1,file2", into the standard cache): with
    only those files cached and the Hub unreachable, the default pair loads (and the app opens with it);
    and a load from an empty cache fetches exactly those files of the repos' real layouts."""
    preload = dict(line.split(" ") for line in front_matter()["preload_from_hub"])   # no commit: what main is
    repos = {name: catalog.CATALOG[name].source for name in catalog.IMAGENET_PAIR}
    assert list(preload) == list(repos.values())
    timm_checkpoint(tmp_path / "vit", "vit_base_patch16_224.augreg2_in21k_ft_in1k", weights="both",
                    depth=1, embed_dim=32, num_heads=2)
    cvt_checkpoint(tmp_path / "cvt", weights="bin")
    readable = {"vit-base": files_of(tmp_path / "vit"), "cvt-13": files_of(tmp_path / "cvt")}
    layouts = {repos[name]: {f: readable[name].get(f, f"{f} (never read)".encode()) for f in files}
               for name, files in HUB_FILES.items()}
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "space-build-cache"))
    try:
        for repo, files in layouts.items():
            hub.publish(repo, files)
        for repo, files in preload.items():   # the Space's build step
            for filename in files.split(","):
                hf_hub_download(repo, filename)
        vhub.clear_cache()
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        requests = hub.count()
        assert all(vhub.available(name) for name in catalog.IMAGENET_PAIR)
        assert [vitviz.load(name, device="cpu").family for name in catalog.IMAGENET_PAIR] == ["vit", "cvt"]
        assert hub.count() == requests

        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        vhub.clear_cache()
        start = len(hub.requests)
        for name in catalog.IMAGENET_PAIR:
            vitviz.load(name, device="cpu")
        fetched = {(r.repo_id, r.filename) for r in hub.requests[start:]
                   if r.method == "GET" and r.filename in layouts.get(r.repo_id, {})}
        assert fetched == {(repo, f) for repo, files in preload.items() for f in files.split(",")}
    finally:
        for repo in layouts:
            hub.remove(repo)
        vhub.clear_cache()
