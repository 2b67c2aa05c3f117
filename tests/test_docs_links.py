"""The documentation's links lead somewhere: every relative link of every Markdown file resolves.

A link in ``README.md``, ``docs/*.md`` or any other tracked Markdown file points either to a
web address (not checked here: that needs the network) or into the repository. A link into the
repository must name a file or folder that is tracked by git (a file only on one machine, or
ignored, is missing in a fresh clone), must stay inside the repository, and when it carries a
``#anchor`` into a Markdown file, that file must have the heading the anchor names (GitHub's
rule: lower case, punctuation dropped, spaces to hyphens, ``-1``, ``-2`` for repeats).
Links inside code blocks and code spans are text, not links.

Also: every page of ``docs/`` is linked from the README's list, and the hand-over files that
were once pasted into the README are gone with every mention of them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Built from pieces so that a search of the repository for these names finds nothing at all.
HAND_OVER_FILES = ("README_" + "hub.md", "README_" + "security.md", "docs_" + "wrong.md")

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of [brackets].
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)=[\"']([^\"']+)[\"']", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def tracked_files(root: Path = ROOT) -> list[str] | None:
    """The repository's tracked files (relative, '/'-separated), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return [name for name in out.stdout.decode("utf-8").split("\0") if name]


def markdown_files(root: Path = ROOT) -> list[Path]:
    tracked = tracked_files(root)
    if tracked is None:  # an unpacked archive: every .md file outside hidden and build folders
        skip = ("node_modules", "build", "dist", "regress-out", "outputs")
        return sorted(p for p in root.rglob("*.md")
                      if not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                                 for part in p.relative_to(root).parts[:-1]))
    return sorted(root / name for name in tracked if name.endswith(".md") and (root / name).is_file())


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with code spans blanked out."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * 3
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield number, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link, image and reference definition."""
    found = []
    for number, line in _prose_lines(text):
        targets = [m.group(1) for m in _INLINE.finditer(line)]
        reference = _REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
        found += [(number, t[1:-1] if t.startswith("<") else t) for t in targets]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "").replace("\\", "")
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (repeats get -1, -2) and <a id>."""
    seen: dict[str, int] = {}
    found = set(_HTML_ANCHOR.findall(text))
    for _, line in _prose_lines(text):
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def check_links(files: list[Path], root: Path, tracked: list[str] | None = None) -> list[str]:
    """One line per broken link: 'file:line: link: why'. ``tracked``: git's files, when known."""
    root = root.resolve()
    tracked_set = set(tracked or ())
    tracked_dirs = {str(Path(name).parent.as_posix()) for name in tracked_set}
    tracked_dirs |= {p for d in list(tracked_dirs) for p in _parents(d)}
    problems = []
    for md in files:
        text = md.read_text(encoding="utf-8")
        where = md.resolve().relative_to(root).as_posix()
        for number, target in links(text):
            if _SCHEME.match(target) or target.startswith("//"):
                continue  # a web address (or mailto:): not checked offline
            why = _problem(md.resolve(), text, target, root, tracked_set, tracked_dirs, tracked is not None)
            if why:
                problems.append(f"{where}:{number}: {target}: {why}")
    return problems


def _parents(posix_dir: str) -> list[str]:
    parts = posix_dir.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _problem(md: Path, text: str, target: str, root: Path, tracked: set[str],
             tracked_dirs: set[str], know_tracked: bool) -> str | None:
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?", 1)[0])
    if not path_part:  # "#anchor": a heading of this same file
        return None if unquote(anchor) in anchors(text) else f"no heading '#{anchor}' in this file"
    resolved = ((root / path_part.lstrip("/")) if path_part.startswith("/") else (md.parent / path_part)).resolve()
    try:
        relative = resolved.relative_to(root).as_posix()
    except ValueError:
        return "points outside the repository"
    if not resolved.exists():
        return f"{relative} does not exist"
    if know_tracked and relative not in tracked and relative not in tracked_dirs and relative != ".":
        return f"{relative} is not tracked by git (untracked or ignored: missing in a fresh clone)"
    markdown = resolved.is_file() and resolved.suffix == ".md"
    if anchor and markdown and unquote(anchor) not in anchors(resolved.read_text(encoding="utf-8")):
        return f"no heading '#{anchor}' in {relative}"
    return None


# ------------------------------------------------------------------------- the repository
def test_the_repository_has_its_documentation():
    names = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/architecture.md", "notebooks/README.md"} <= names


def test_every_relative_link_resolves():
    problems = check_links(markdown_files(), ROOT, tracked_files())
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_listed_in_the_readme():
    readme = {target.split("#")[0] for _, target in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    unlisted = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))
                if p.relative_to(ROOT).as_posix() not in readme]
    assert not unlisted, f"docs pages missing from README.md's Documentation list: {unlisted}"


def test_the_hand_over_files_are_gone_and_nothing_mentions_them():
    assert not [name for name in HAND_OVER_FILES if (ROOT / name).exists()]
    tracked = tracked_files()
    if tracked is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    mentions = []
    for name in tracked:
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        mentions += [f"{name} mentions {h}" for h in HAND_OVER_FILES if h.encode() in data]
    assert not mentions, "\n".join(mentions)


# ------------------------------------------------------------------- the checker can fail
def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# The guide\n\n## Set it up\n\n## Set it up\n")
    (tmp_path / "tool.py").write_text("")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n"
        "[fine](docs/guide.md) [fine too](docs/guide.md#set-it-up) [repeat](docs/guide.md#set-it-up-1)\n"
        "[here](#title) [code](tool.py#L1) [web](https://example.org/missing) [mail](mailto:a@b.c)\n"
        "[gone](docs/missing.md)\n"
        "[no heading](docs/guide.md#install)\n"
        "[no heading here](#usage)\n"
        "[outside](../elsewhere.md)\n"
        "![picture](img/plot.png)\n"
        "`[in code](nowhere.md)`\n"
        "```\n[in a block](nowhere.md)\n```\n"
        "[ref]: docs/old.md\n"
    )
    problems = check_links([readme], tmp_path)
    assert problems == [
        "README.md:4: docs/missing.md: docs/missing.md does not exist",
        "README.md:5: docs/guide.md#install: no heading '#install' in docs/guide.md",
        "README.md:6: #usage: no heading '#usage' in this file",
        "README.md:7: ../elsewhere.md: points outside the repository",
        "README.md:8: img/plot.png: img/plot.png does not exist",
        "README.md:13: docs/old.md: docs/old.md does not exist",
    ]


def test_a_link_to_an_untracked_file_is_reported(tmp_path):
    (tmp_path / "notes.md").write_text("local only\n")
    (tmp_path / "README.md").write_text("[notes](notes.md) [readme](README.md) [folder](.)\n")
    problems = check_links([tmp_path / "README.md"], tmp_path, tracked=["README.md"])
    assert problems == ["README.md:1: notes.md: notes.md is not tracked by git "
                        "(untracked or ignored: missing in a fresh clone)"]


@pytest.mark.parametrize("heading, anchor", [
    ("Across nodes (NCCL)", "across-nodes-nccl"),
    ("Fine-tune a language model: `task=\"causal_lm\"` (LoRA, QLoRA, full)",
     "fine-tune-a-language-model-taskcausal_lm-lora-qlora-full"),
    ("What the server configuration enforces", "what-the-server-configuration-enforces"),
    ("The [image](image.md), its volumes", "the-image-its-volumes"),
])
def test_headings_become_githubs_anchors(heading, anchor):
    assert slug(heading) == anchor


def test_the_top_level_holds_only_the_project_folders():
    tracked = tracked_files()
    if tracked is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    allowed = {"README.md", "pyproject.toml", "Makefile", "notebooks", "workbench", "docker",
               "environment", "tests", "benchmarks", "scripts", "docs"}
    top = {name.split("/")[0] for name in tracked}
    extra = sorted(name for name in top - allowed if not name.startswith("."))
    assert not extra, f"put these in a folder (docs/, scripts/, ...) or remove them: {extra}"
