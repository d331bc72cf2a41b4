"""The `radixcache` click group. Commands live in their own modules and register here."""

from __future__ import annotations

import click

from radixcache.cli.cache import cache
from radixcache.cli.chat import chat
from radixcache.cli.demo import demo
from radixcache.cli.doctor import doctor
from radixcache.cli.model import model
from radixcache.cli.replay import replay
from radixcache.cli.serve import serve
from radixcache.cli.simulate import simulate
from radixcache.cli.trace import trace


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="radixcache")
def main() -> None:
    """radixcache: a radix-tree prefix KV cache, its simulator, and a runtime that uses it.

    \b
    Examples:
      radixcache replay                      # the built-in sample chat trace through SmolLM2
      radixcache replay --compare            # the same with and without the cache
      radixcache simulate TRACE --capacity-blocks 8000 --belady
    """


main.add_command(cache)
main.add_command(chat)
main.add_command(demo)
main.add_command(doctor)
main.add_command(model)
main.add_command(replay)
main.add_command(serve)
main.add_command(simulate)
main.add_command(trace)
