"""The scripts of docs/how-to/torchrun.md and frameworks.md run as the pages say, on 2 CPU
processes.

A script is a fenced ``python`` block whose first line names its file (``# train_x.py``); the
first fenced ``sh`` block after it holds the command that launches it (``torchrun ...`` or
``python ...``). Each script runs in a fresh directory; a block without a file name is a
fragment and is not run.

Every relative link of README.md and docs/ leads to a file (and heading) that exists.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from integration_launch import launch

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "how-to" / name for name in ("torchrun.md", "frameworks.md")]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
NAME = re.compile(r"# (\w+\.py)\n")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```$", re.M | re.S)


def scripts() -> list[tuple[str, str, list[str]]]:
    """(file name, source, launch command) of every script on the pages, in order."""
    found: list[tuple[str, str, list[str]]] = []
    pending: tuple[str, str] | None = None
    for lang, body in FENCE.findall("".join(page.read_text() for page in PAGES)):
        if lang == "python" and (m := NAME.match(body)):
            pending = (m.group(1), body)
        elif lang == "sh" and pending is not None:
            command = body.splitlines()[0].split("#")[0]
            found.append((*pending, shlex.split(command)))
            pending = None
    return found


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"no {module}")


def test_the_page_has_every_framework() -> None:
    assert [name for name, _, _ in scripts()] == [
        "train_torchrun.py", "train_lightning.py", "train_accelerate.py",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "source", "command"),
    [pytest.param(*s, id=s[0], marks=_needs(s[0][6:-3].replace("torchrun", "torch")))
     for s in scripts()],
)  # fmt: skip
def test_script_runs_as_documented(name: str, source: str, command: list[str],
                                   tmp_path: Path) -> None:  # fmt: skip
    assert name in command
    (tmp_path / name).write_text(source)
    program = {"torchrun": [sys.executable, "-m", "torch.distributed.run"],
               "python": [sys.executable]}[command[0]]  # fmt: skip
    launch([*program, *command[1:]], tmp_path, f"`{shlex.join(command)}`")
    checkpoint = {"train_torchrun.py": "checkpoint.pt", "train_lightning.py": "checkpoints/last.ckpt",
                  "train_accelerate.py": "checkpoint/custom_checkpoint_0.pkl"}[name]  # fmt: skip
    assert (tmp_path / checkpoint).is_file()


def test_import_hipress_needs_no_framework() -> None:
    code = (
        "import sys, hipress, hipress.casync, hipress.integrations\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'accelerate',"
        " 'pytorch_lightning')], sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading's numbered from -1."""
    counts: dict[str, int] = {}
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.*)$", CODE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        counts[slug] = n + 1
    return anchors


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(CODE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
