"""The docs against the code: every ``fastload ...`` command line that README.md and docs/ show is
parsed by the command's own parser (so no stale flag survives a rename), README's links into docs/
point at files and headings that exist, and no page names a path of a developer's machine.

A command line is one of three kinds, told apart by what it holds:

- a **concrete command** (``fastload convert raw/ out --from imagefolder``; upper-case placeholders
  such as ``SRC`` or ``URL`` are plain strings to argparse): parsed whole, and must be accepted;
- a **synopsis** (usage-style ``[--optional ...]`` groups, ``{a,b}`` choices, ``a|b`` alternatives):
  parsed with its optional groups dropped and the first of each choice taken, and every flag it
  names, inside the brackets too, must be one of the subcommand's own (no abbreviation), every
  listed choice one the flag accepts;
- an **excerpt** (``fastload bench ... --epochs 2``: a ``...`` stands for arguments left out): every
  flag must be the subcommand's own, and parsing what is shown may fail only for want of the
  arguments the ``...`` stands for.

A bare ``fastload SUBCOMMAND`` names the subcommand in prose: it must exist.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from fastload.bench import BACKENDS
from fastload.cli.command import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # N, PX, USD_PER_HOUR: a value the reader supplies
ELLIPSIS = "..."


@dataclass(frozen=True)
class Shown:
    """A ``fastload ...`` command line as a page shows it."""

    page: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def commands_in(page: Path) -> list[Shown]:
    """The ``fastload ...`` lines of the page's code blocks (continuation lines joined) and inline
    code spans (which may wrap across lines of a paragraph)."""
    found: list[Shown] = []
    prose: list[str] = []  # the page with its code blocks blanked out, for the inline spans
    fence: str | None = None
    pending: tuple[int, str] | None = None  # a code line continued with a backslash
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            prose.append("")
            continue
        if fence is not None:
            prose.append("")
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence, pending = None, None
                continue
            start, text = pending if pending else (number, "")
            text += line.strip()
            if text.endswith("\\"):
                pending = (start, text[:-1] + " ")
                continue
            pending = None
            if text.startswith("fastload "):
                found.append(Shown(page, start, " ".join(text.split())))
            continue
        prose.append(line)
    text = "\n".join(prose)
    for match in INLINE.finditer(text):
        code = " ".join(match.group(2).split())
        if code.startswith("fastload "):
            found.append(Shown(page, text.count("\n", 0, match.start()) + 1, code))
    return found


def all_commands() -> list[Shown]:
    return [shown for page in PAGES for shown in commands_in(page)]


def strict_parser() -> argparse.ArgumentParser:
    """The command's parser, refusing abbreviated flags (argparse takes ``--epoch`` for ``--epochs``
    by default, which would let a renamed flag's old prefix pass)."""
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.allow_abbrev = False
    parser.allow_abbrev = False
    return parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the fastload parser has no subcommands")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None if ``argv`` parses, else argparse's complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return lines[-1] if lines else "refused"
    return None


def words(text: str) -> list[str]:
    """The command's words, a trailing ``# comment`` and anything after a pipe or ``&&`` dropped."""
    out: list[str] = []
    depth = 0  # inside a synopsis's [...] group a lone | separates alternatives, not commands
    for word in shlex.split(text, comments=True):
        if depth == 0 and word in ("|", "||", "&&", ";", "&"):
            break
        depth += word.count("[") - word.count("]")
        out.append(word)
    return out


def is_synopsis(tokens: list[str]) -> bool:
    return any(re.search(r"[\[\]]|\{[^}]*,[^}]*\}|\|", t) for t in tokens)


def check_flags(sub: argparse.ArgumentParser, name: str, tokens: list[str]) -> list[str]:
    """Every ``--flag`` among ``tokens`` is one of ``sub``'s own option strings, and every value
    shown for a flag with choices (alternatives split on ``|`` and ``{a,b}``) is one of them."""
    problems = []
    options = sub._option_string_actions
    for i, token in enumerate(tokens):
        flag = token.strip("[]{}").split("=", 1)[0]
        if not flag.startswith("-") or flag in ("-", "--"):
            continue
        action = options.get(flag)
        if action is None:
            problems.append(f"{flag} is not an option of fastload {name}")
            continue
        if action.nargs == 0:
            continue
        value = token.split("=", 1)[1] if "=" in token else (tokens[i + 1] if i + 1 < len(tokens) else "")
        value = value.strip("[]")
        if value.startswith("-") or value == ELLIPSIS:
            continue
        alternatives = [v for v in re.split(r"[|{},]" if "{" in value or "|" in value else r"\|", value) if v]
        for v in alternatives:
            if PLACEHOLDER.match(v) or v == ELLIPSIS:
                continue
            if action.choices is not None and v not in action.choices:
                problems.append(f"{flag} {v}: not one of {sorted(action.choices)}")
            if name == "bench" and flag == "--backends":
                unknown = [b for b in v.split(",") if b and b not in BACKENDS and b != ELLIPSIS]
                if unknown:
                    problems.append(f"--backends {','.join(unknown)}: not among {BACKENDS}")
    return problems


def minimal(text: str) -> list[str]:
    """A synopsis as the least concrete command it allows: optional groups dropped, the first of
    every choice taken."""
    previous = None
    while previous != text:
        previous, text = text, re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\{([^{},]*),[^{}]*\}", r"\1", text)
    return [w.split("|", 1)[0] for w in words(text)]


def stand_ins(sub: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with a placeholder given to a flag that takes a number or a choice (``--workers N``,
    ``--from NAME``) replaced by a value it accepts: the placeholder stands for any such value."""
    out = list(argv)
    for i in range(1, len(out)):
        action = sub._option_string_actions.get(out[i - 1])
        if action is None or action.nargs == 0 or not PLACEHOLDER.match(out[i]):
            continue
        if action.choices is not None:
            out[i] = str(next(iter(action.choices)))
        elif action.type in (int, float):
            out[i] = "1"
    return out


def check_command(parser: argparse.ArgumentParser, text: str) -> str | None:
    """None if the page's command line agrees with the parser, else what is wrong."""
    tokens = words(text)
    assert tokens and tokens[0] == "fastload", text
    subs = subparsers(parser)
    if len(tokens) < 2 or tokens[1] not in subs:
        return f"no subcommand {tokens[1] if len(tokens) > 1 else ''!r} (known: {sorted(subs)})"
    name, sub, rest = tokens[1], subs[tokens[1]], tokens[2:]
    if not rest:
        return None  # a subcommand named in prose
    problems = check_flags(sub, name, rest)
    if problems:
        return "; ".join(problems)
    if ELLIPSIS in rest:
        complaint = parse(parser, [name, *stand_ins(sub, minimal(" ".join(t for t in rest if t != ELLIPSIS)))])
        if complaint and "the following arguments are required" not in complaint:
            return complaint
        return None
    if is_synopsis(rest):
        return parse(parser, [name, *stand_ins(sub, minimal(" ".join(rest)))])
    return parse(parser, [name, *stand_ins(sub, rest)])


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return strict_parser()


def test_the_pages_show_commands() -> None:
    """The extraction finds the commands (an extractor that finds nothing checks nothing), and every
    subcommand is shown somewhere."""
    shown = all_commands()
    assert len(shown) >= 40, [str(s) for s in shown]
    named = {words(s.text)[1] for s in shown if len(words(s.text)) > 1}
    assert set(subparsers(build_parser())) <= named, f"not shown in any page: {set(subparsers(build_parser())) - named}"


@pytest.mark.parametrize("shown", all_commands(), ids=lambda s: f"{s.page.relative_to(ROOT)}:{s.line}")
def test_command_parses(parser: argparse.ArgumentParser, shown: Shown) -> None:
    problem = check_command(parser, shown.text)
    assert problem is None, f"{shown}\n  -> {problem}"


@pytest.mark.parametrize(
    "text",
    [
        "fastload convert SRC OUT --from imagefolder --shards-size 64MB",  # a flag that does not exist
        "fastload convert SRC OUT --from folders",  # a choice that does not exist
        "fastload bench DATASET --epoch 2",  # an abbreviation of --epochs: refused, a rename would pass it
        "fastload bench DATASET --backends fastload-cpu,pytorch",  # a backend that does not exist
        "fastload bench ... --epoch 2",  # an excerpt with a bad flag
        "fastload bench ... --transform crop",  # an excerpt with a bad value
        "fastload verify OUT [--decoded]",  # a synopsis with a bad optional flag
        "fastload convert SRC OUT --from {imagefolder,folders}",  # a synopsis with a bad choice
        "fastload convert SRC OUT --from imagefolder [--hdf5-decoded [--hdf5-compression gzip|zstd]]",
        "fastload describe DATASET",  # a required flag missing (--step)
        "fastload compress DATASET",  # no such subcommand
    ],
)
def test_a_stale_command_is_refused(parser: argparse.ArgumentParser, text: str) -> None:
    assert check_command(parser, text) is not None


def test_a_renamed_flag_fails_a_page(parser: argparse.ArgumentParser, tmp_path: Path) -> None:
    """A page showing a flag the parser no longer has fails, in a code block with a continuation
    line and in inline code wrapped across lines."""
    page = tmp_path / "page.md"
    page.write_text(
        "Convert:\n\n```bash\nfastload convert raw/ out --from imagefolder \\\n    --shard-size 64MB --num-workers 2\n```\n\n"
        "then `fastload verify\nout --decode`.\n",
        encoding="utf-8",
    )
    shown = commands_in(page)
    assert [(s.line, s.text) for s in shown] == [
        (4, "fastload convert raw/ out --from imagefolder --shard-size 64MB --num-workers 2"),
        (8, "fastload verify out --decode"),
    ]
    assert "--num-workers" in (check_command(parser, shown[0].text) or "")
    assert check_command(parser, shown[1].text) is None


MARKDOWN_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives the page's headings (Python-Markdown's toc slugs)."""
    anchors, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        title = re.sub(r"`([^`]*)`", r"\1", line.lstrip("#").strip())
        slug = re.sub(r"[^\w\s-]", "", title).strip().lower()
        anchors.add(re.sub(r"[-\s]+", "-", slug))
    return anchors


def test_readme_links_into_docs_exist() -> None:
    readme = ROOT / "README.md"
    links = [m.group(1) for m in MARKDOWN_LINK.finditer(readme.read_text(encoding="utf-8"))]
    local = [link for link in links if not re.match(r"[a-z]+:|#", link)]
    assert any(link.startswith("docs/") for link in local), "README links to no page of docs/"
    for link in local:
        path, _, anchor = link.partition("#")
        target = (readme.parent / path).resolve()
        assert target.is_file(), f"README.md links to {link}: no such file"
        if anchor and target.suffix == ".md":
            assert anchor in heading_anchors(target), f"README.md links to {link}: no such heading"


def test_no_machine_paths_in_the_pages() -> None:
    """The pages name paths relative to the checkout (data/..., benchmarks/...), never a folder of
    the machine they were written on."""
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            assert not re.search(r"(?<![\w.])/(?:work|tmp|home)/", line), f"{page.relative_to(ROOT)}:{number}: {line}"
