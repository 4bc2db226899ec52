"""docs/cli.md's ``--help`` blocks, rendered from the click tree, so the command reference cannot drift from
the code: the page's prose is written by hand, each ``<!-- help: streamproc CMD -->`` block is generated.

``python -m streamproc.cli_reference [PAGE]`` prints PAGE (default docs/cli.md) with every block refreshed;
``--write`` rewrites it in place. A command without a block gets a section at the end of the page."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from streamproc.cli import cli

WIDTH = 100  # fixed, so the page does not depend on the terminal that generated it
BLOCK = re.compile(r"<!-- help: (?P<path>[^>]+?) -->\n.*?<!-- /help -->", re.DOTALL)
UNDESCRIBED = "## Commands without a description yet"


def command_paths() -> Iterator[tuple[str, click.Command, click.Context]]:
    """Every visible command and group under ``streamproc``, depth first in name order, with its context."""
    root = click.Context(cli, info_name="streamproc", terminal_width=WIDTH, max_content_width=WIDTH,
                         **cli.context_settings)
    yield "streamproc", cli, root

    def walk(group: click.Group, parent: click.Context) -> Iterator[tuple[str, click.Command, click.Context]]:
        for name in sorted(group.list_commands(parent)):
            command = group.get_command(parent, name)
            if command is None or command.hidden:
                continue
            ctx = click.Context(command, info_name=name, parent=parent, terminal_width=WIDTH,
                                max_content_width=WIDTH, **command.context_settings)
            yield ctx.command_path, command, ctx
            if isinstance(command, click.Group):
                yield from walk(command, ctx)

    yield from walk(cli, root)


def help_block(path: str, command: click.Command, ctx: click.Context) -> str:
    """The marked block of one command: its ``--help`` exactly as the command prints it (at ``WIDTH``)."""
    return f"<!-- help: {path} -->\n```text\n{command.get_help(ctx).rstrip()}\n```\n<!-- /help -->"


def render(page: str) -> str:
    """``page`` with every help block regenerated; a block naming no command is an error, a command with no
    block gets one under ``UNDESCRIBED`` at the end."""
    blocks = {path: help_block(path, command, ctx) for path, command, ctx in command_paths()}
    unknown = sorted({match["path"] for match in BLOCK.finditer(page)} - blocks.keys())
    if unknown:
        raise ValueError(f"help blocks for commands that do not exist: {', '.join(unknown)}")
    page = BLOCK.sub(lambda match: blocks[match["path"]], page)
    missing = [path for path in blocks if f"<!-- help: {path} -->" not in page]
    if missing:
        if UNDESCRIBED not in page:
            page = page.rstrip("\n") + f"\n\n{UNDESCRIBED}\n"
        page = page.rstrip("\n") + "\n" + "".join(f"\n### `{path}`\n\n{blocks[path]}\n" for path in missing)
    return page


def main(argv: list[str]) -> int:
    write = "--write" in argv
    paths = [arg for arg in argv if arg != "--write"]
    page = Path(paths[0] if paths else "docs/cli.md")
    text = render(page.read_text(encoding="utf-8"))
    if write:
        page.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
