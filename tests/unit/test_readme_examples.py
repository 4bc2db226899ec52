"""Every ``streamproc`` command the README and the docs show runs as written: each one in a shell code block is
parsed by the real click command tree (command path, options, values, required options, arguments), and each one
in the prose's inline code names real commands and options. A renamed flag or a wrong example fails here, and so
does a link between the pages that leads nowhere, or a ``--help`` block of docs/cli.md that is not what the
command prints (``scripts/cli-reference`` regenerates them)."""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from streamproc.cli import cli
from streamproc.cli_reference import UNDESCRIBED, command_paths, render
from streamproc.errors import MEANINGS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLI_PAGE = ROOT / "docs" / "cli.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
DESIGN = ROOT / "docs" / "design.md"
NOT_BUILT: set[str] = set()  # commands designed in design.md §8, not built: the design may name them, no other page
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ANY_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(streamproc [^`]+)`")
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
REDIRECTED = "<redirected>"  # the words after a redirection name a file, not arguments


def shell_commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a shell snippet: continuation lines joined, ``$ `` prompts and comments dropped,
    split at pipes, lists, subshells and redirections, leading variable assignments dropped."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line.strip().removeprefix("$ "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(lexer.punctuation_chars):
                redirection = token in {">", ">>", "<", ">&"}
                if redirection and words and words[-1].isdigit():
                    words.pop()  # 2> file: a file descriptor, not an argument
                while words and ASSIGNMENT.match(words[0]):
                    words.pop(0)
                if words and words[0] != REDIRECTED:
                    yield words
                words = [REDIRECTED] if redirection else []
            elif words[:1] != [REDIRECTED]:
                words.append(token)


def streamproc_args(words: list[str]) -> list[str] | None:
    """The arguments after ``streamproc`` (or a path to it), or None for another program."""
    return words[1:] if words[0].rsplit("/", 1)[-1] == "streamproc" else None


def fenced_examples(text: str) -> list[list[str]]:
    found = []
    for block in SHELL_BLOCK.findall(text):
        for words in shell_commands(block):
            args = streamproc_args(words)
            if args is not None:
                found.append(args)
    return found


def inline_examples(text: str) -> list[list[str]]:
    prose = ANY_BLOCK.sub("", text)
    return [shlex.split(span)[1:] for span in INLINE.findall(prose)]


def resolve(args: list[str]) -> tuple[click.Command, click.Context, list[str]]:
    """The command an argument list names (through groups), its context, and the arguments left for it."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="streamproc", **cli.context_settings)  # -h too, as the real command
    rest = list(args)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        sub = command.get_command(ctx, name)
        if sub is None:
            raise click.UsageError(f"no command {name!r} in {ctx.command_path!r}")
        command, ctx = sub, click.Context(sub, info_name=name, parent=ctx)
    return command, ctx, rest


def check_runs_as_written(args: list[str], workdir: Path) -> None:
    """Parse as ``streamproc`` would, values converted and checked; the files the example reads are made empty in
    ``workdir`` first, as a reader would have them."""
    command, ctx, rest = resolve(args)
    opts, _, _ = command.make_parser(ctx).parse_args(list(rest))
    for param in command.params:
        if isinstance(param.type, click.Path) and param.type.exists and param.name in opts:
            values = opts[param.name]
            for value in values if isinstance(values, list | tuple) else [values]:
                path = workdir / str(value)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    try:
        command.make_context(ctx.info_name, list(rest), parent=ctx.parent)
    except click.exceptions.Exit as done:  # --help, --version
        assert done.exit_code == 0


def check_names_exist(args: list[str]) -> None:
    """Commands and option names only: prose may hold placeholders such as FILE or ID."""
    command, ctx, rest = resolve(args)
    command.make_parser(ctx).parse_args(list(rest))


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def examples_of(extract: Callable[[str], list[list[str]]]) -> list[tuple[str, list[str]]]:
    """The examples of every page, with the page they are on; the design's not-built commands left out."""
    found = []
    for page in PAGES:
        for args in extract(page.read_text(encoding="utf-8")):
            if not (page == DESIGN and args[:1] and args[0] in NOT_BUILT):
                found.append((page_name(page), args))
    return found


EXAMPLES = examples_of(fenced_examples)
INLINE_EXAMPLES = examples_of(inline_examples)


def describe(example: tuple[str, list[str]] | list[str]) -> str:
    if isinstance(example, tuple):
        page, args = example
        return f"{page}: {shlex.join(['streamproc', *args])}"
    return shlex.join(["streamproc", *example])


def test_the_pages_have_examples_of_every_command_they_document() -> None:
    shown = {tuple(args[:1]) for _, args in EXAMPLES}
    assert {("run",), ("submit",), ("status",), ("batches",), ("cancel",), ("results",), ("backfill",), ("lag",),
            ("worker",), ("forget",), ("sink",), ("broker",), ("mock-llm",), ("real-llm",)} <= shown
    assert len(EXAMPLES) >= 30 and len(INLINE_EXAMPLES) >= 5
    in_readme = {tuple(args[:1]) for page, args in EXAMPLES if page == "README.md"}
    assert {("run",), ("worker",), ("submit",), ("status",), ("results",), ("backfill",)} <= in_readme
    assert not NOT_BUILT & set(cli.commands), "built now: take it out of NOT_BUILT"


@pytest.mark.parametrize("example", EXAMPLES, ids=describe)
def test_every_example_runs_as_written(example: tuple[str, list[str]], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    page, args = example
    monkeypatch.chdir(tmp_path)
    try:
        check_runs_as_written(args, tmp_path)
    except click.ClickException as exc:
        pytest.fail(f"{page}: `{describe(args)}`: {exc.format_message()}")


@pytest.mark.parametrize("example", INLINE_EXAMPLES, ids=describe)
def test_every_command_named_in_the_prose_exists(example: tuple[str, list[str]]) -> None:
    page, args = example
    try:
        check_names_exist(args)
    except click.ClickException as exc:
        pytest.fail(f"{page}: `{describe(args)}`: {exc.format_message()}")


def test_the_command_reference_lists_the_exit_codes_of_the_cli() -> None:
    text = CLI_PAGE.read_text(encoding="utf-8")
    for code, meaning in MEANINGS.items():
        assert f"| {int(code)} | {meaning} |" in text


def test_the_help_blocks_of_the_command_reference_are_what_the_commands_print() -> None:
    """Run ``scripts/cli-reference`` when this fails: it rewrites the blocks from the command tree."""
    text = CLI_PAGE.read_text(encoding="utf-8")
    assert render(text) == text
    assert UNDESCRIBED not in text, "a command has no section of its own in docs/cli.md"
    for path, _, _ in command_paths():
        assert text.count(f"<!-- help: {path} -->") == 1, path


def test_the_reference_generator_refreshes_blocks_and_refuses_unknown_commands() -> None:
    stale = "# x\n\n<!-- help: streamproc lag -->\n```text\nUsage: streamproc lag --old\n```\n<!-- /help -->\n"
    fresh = render(stale)
    assert "--old" not in fresh and "--max-lag" in fresh
    assert f"{UNDESCRIBED}\n" in fresh and "<!-- help: streamproc broker start -->" in fresh  # the missing ones
    assert render(fresh) == fresh
    with pytest.raises(ValueError, match="streamproc teleport"):
        render("<!-- help: streamproc teleport -->\n<!-- /help -->\n")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", lambda match: match.group(1) or "", heading).strip().lower()
    kept = "".join(char for char in text
                   if char in " -" or unicodedata.category(char)[0] in {"L", "N"})
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = ANY_BLOCK.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(text):
        slug = anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_anchors_are_githubs() -> None:
    assert anchor("5.5 Guards: the order a call meets them") == "55-guards-the-order-a-call-meets-them"
    assert anchor("`streamproc lag` — consumer lag") == "streamproc-lag--consumer-lag"


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_every_link_between_the_pages_resolves(page: Path) -> None:
    """Links to files of the repository that exist, and to headings those pages have."""
    text = ANY_BLOCK.sub("", page.read_text(encoding="utf-8"))
    local = [(target, fragment) for target, fragment in LINK.findall(text)
             if not target.startswith(("http://", "https://", "mailto:"))]
    broken = []
    for target, fragment in local:
        linked = (page.parent / target).resolve() if target else page
        if not linked.exists():
            broken.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}#{fragment}")
    assert not broken, broken
    if page == README:
        assert local


@pytest.mark.parametrize("page", [page for page in PAGES if page != DESIGN], ids=page_name)
def test_the_pages_refer_only_to_what_a_reader_has(page: Path) -> None:
    """No internal issue numbers: a reader has no tracker."""
    assert not re.search(r"\bissues? \d+", page.read_text(encoding="utf-8"), re.IGNORECASE)


@pytest.mark.parametrize("example", [
    "streamproc status --batch-id b --no-such-flag",
    "streamproc backfill --since 29/11/2026",
    "streamproc lag --max-lag many",
    "streamproc results --output out.jsonl",  # --batch-id is required
    "streamproc broker restart",
    "STREAMPROC_DATA_DIR=/tmp/x streamproc submit requests.jsonl --batch-id b --batch-size 10 | tee log",
])
def test_a_wrong_example_fails_the_check(example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    [args] = fenced_examples(f"```bash\n{example}\n```\n")
    with pytest.raises(click.UsageError):
        check_runs_as_written(args, tmp_path)


def test_the_extractor_reads_shell_as_a_shell_does() -> None:
    script = ("$ streamproc status --batch-id b --json   # a comment\n"
              "export STREAMPROC_KAFKA_BOOTSTRAP=$(streamproc broker status --bootstrap)\n"
              "STREAMPROC_LLM_API_KEY=sk-1 streamproc worker --loglevel INFO 2> worker.log\n"
              "streamproc lag --max-lag 10 || page-someone\n"
              "streamproc run in.jsonl \\\n  --output out.jsonl | tail -1\n"
              ".venv/bin/streamproc broker stop; echo done\n")
    assert fenced_examples(f"```bash\n{script}```\n") == [
        ["status", "--batch-id", "b", "--json"], ["broker", "status", "--bootstrap"],
        ["worker", "--loglevel", "INFO"], ["lag", "--max-lag", "10"], ["run", "in.jsonl", "--output", "out.jsonl"],
        ["broker", "stop"]]


def test_the_readme_stays_a_ten_minute_read() -> None:
    """The rest belongs in docs/: the README keeps what a newcomer needs first."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_design_opens_with_its_overview_and_the_concept_map_names_real_modules() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    overview = text[:text.index("\n## 1. The job")]
    assert "```mermaid\nflowchart" in overview
    table = overview[overview.index("**Where each concept lives**"):]
    paths = [word for word in re.findall(r"`([^`\s]+)`", table) if "/" in word or word.endswith(".py")]
    assert len(paths) >= 40
    missing = [path for path in paths
               if not (any((ROOT / "streamproc").glob(path)) or any(ROOT.glob(path)))]
    assert not missing, missing


def test_every_setting_is_in_the_configuration_page() -> None:
    """Each ``STREAMPROC_*`` variable has a row: by its full name, or as ``_SUFFIX`` beside a sibling's full name
    (``STREAMPROC_BREAKER_FAILURE_RATE`` / ``_WINDOW_S``)."""
    from streamproc.settings import Settings

    lines = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith("| `STREAMPROC_")]

    def documented(variable: str) -> bool:
        parts = variable.split("_")
        return any(f"`{variable}`" in row or any(
            f"`{'_'.join(parts[:cut])}_" in row and f"`_{'_'.join(parts[cut:])}`" in row
            for cut in range(2, len(parts))) for row in rows)

    missing = [f"STREAMPROC_{name.upper()}" for name in Settings.model_fields
               if not documented(f"STREAMPROC_{name.upper()}")]
    assert not missing, missing
