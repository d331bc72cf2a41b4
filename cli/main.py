"""The `radixcache` click group. Commands live in their own modules and register here; `run` is the console script."""

from __future__ import annotations

import click

from radixcache.cli.cache import cache
from radixcache.cli.chat import chat
from radixcache.cli.demo import demo
from radixcache.cli.doctor import doctor
from radixcache.cli.errors import FriendlyGroup
from radixcache.cli.exit import exit_now, exit_status
from radixcache.cli.model import model
from radixcache.cli.replay import replay
from radixcache.cli.serve import serve
from radixcache.cli.simulate import simulate
from radixcache.cli.trace import trace


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="radixcache")
def main() -> None:
    """radixcache: a radix-tree prefix KV cache, its simulator, and a runtime that uses it.

    \b
    Examples:
      radixcache replay                      # the built-in sample chat trace through SmolLM2
      radixcache replay --compare            # the same with and without the cache
      radixcache simulate TRACE --capacity-blocks 8000 --belady
    """


def run() -> None:
    """The `radixcache` console script: `main` in standalone mode, then `cli.exit.exit_now` with its status (no
    interpreter teardown, about 0.65 s of CPU once torch is loaded). `main` itself is what tests' CliRunner calls."""
    try:
        main()
    except SystemExit as done:
        exit_now(exit_status(done.code))
    exit_now(0)


main.add_command(cache)
main.add_command(chat)
main.add_command(demo)
main.add_command(doctor)
main.add_command(model)
main.add_command(replay)
main.add_command(serve)
main.add_command(simulate)
main.add_command(trace)


if __name__ == "__main__":  # `python -m radixcache.cli.main ...` runs the command too (it did nothing, exit 0)
    run()
