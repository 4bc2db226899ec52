"""Every ``streamproc`` command the README shows runs as written: each one in a shell code block is parsed by
the real click command tree (command path, options, values, required options, arguments), and each one in
the prose's inline code names real commands and options. A renamed flag or a wrong example fails here."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from streamproc.cli import cli
from streamproc.errors import MEANINGS

README = Path(__file__).resolve().parents[2] / "README.md"
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
ANY_BLOCK = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(streamproc [^`]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
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
    ctx = click.Context(cli, info_name="streamproc")
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


def describe(args: list[str]) -> str:
    return shlex.join(["streamproc", *args])


EXAMPLES = fenced_examples(README.read_text(encoding="utf-8"))
INLINE_EXAMPLES = inline_examples(README.read_text(encoding="utf-8"))


def test_the_readme_has_examples_of_every_command_it_documents() -> None:
    shown = {tuple(args[:1]) for args in EXAMPLES}
    assert {("run",), ("submit",), ("status",), ("batches",), ("cancel",), ("results",), ("backfill",), ("lag",),
            ("worker",), ("sink",), ("broker",), ("mock-llm",), ("real-llm",)} <= shown
    assert len(EXAMPLES) >= 30 and len(INLINE_EXAMPLES) >= 5


@pytest.mark.parametrize("args", EXAMPLES, ids=describe)
def test_every_readme_example_runs_as_written(args: list[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        check_runs_as_written(args, tmp_path)
    except click.ClickException as exc:
        pytest.fail(f"README: `{describe(args)}`: {exc.format_message()}")


@pytest.mark.parametrize("args", INLINE_EXAMPLES, ids=describe)
def test_every_command_named_in_the_prose_exists(args: list[str]) -> None:
    try:
        check_names_exist(args)
    except click.ClickException as exc:
        pytest.fail(f"README: `{describe(args)}`: {exc.format_message()}")


def test_the_readme_lists_the_exit_codes_of_the_cli() -> None:
    text = README.read_text(encoding="utf-8")
    for code, meaning in MEANINGS.items():
        assert f"| {int(code)} | {meaning} |" in text


def test_the_readme_refers_only_to_what_a_reader_has() -> None:
    """Links to files of the repository that exist, and no internal issue numbers (a reader has no tracker)."""
    text = README.read_text(encoding="utf-8")
    targets = LINK.findall(text)
    local = [target for target in targets if not target.startswith(("http://", "https://"))]
    assert local and all((README.parent / target).exists() for target in local), local
    assert not re.search(r"\bissues? \d+", text, re.IGNORECASE)


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
