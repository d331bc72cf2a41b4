"""`radixcache chat`: an interactive multi-turn chat that shows, after each reply, what the cache saved."""

from __future__ import annotations

import sys

import click

from radixcache.cli import engine_options
from radixcache.cli.errors import EXIT_ERROR, EXPECTED, FriendlyCommand, debug_option, describe, fail, one_line
from radixcache.cli.terminal import terminal_text

COMMANDS = "/exit to leave, /reset to start over"


def _to_terminal() -> bool:
    """Whether stdout is a terminal: a pipe or a file gets the reply's characters unescaped."""
    return click.get_text_stream("stdout").isatty()


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """click's FloatRange lets NaN through (no comparison with it is true); the engine refused it at every turn."""
    if value != value:
        raise click.BadParameter("nan is not a temperature")
    return value


@click.command(cls=FriendlyCommand)
@engine_options.model_option
@click.option("--system", default=None, help="A system prompt for the conversation.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(min=1), help="Tokens per reply.")
@click.option(
    "--temperature",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 100),  # the engine's range (runtime.engine.sampling.MAX_TEMPERATURE)
    callback=_finite,
    help="0 is greedy.",
)
@click.option(
    "--seed", default=0, show_default=True, type=engine_options.SEED, help="Sampling seed (turn i uses seed + i)."
)
@click.option("--no-cache", is_flag=True, help="Disable the prefix cache (every turn prefills its whole history).")
@engine_options.engine_choice_options
@debug_option
def chat(
    model: str,
    system: str | None,
    max_tokens: int,
    temperature: float,
    seed: int,
    no_cache: bool,
    engine_choices: engine_options.EngineChoices,
    debug: bool,
) -> None:
    """Chat with the model, turn by turn. After each reply: tokens served from the cache, tokens prefilled,
    the time to first token and the decode speed. Type /exit (or end the input) to leave, /reset to start over.
    A turn the engine refuses (past the model's context, say) is dropped with an error line and the chat goes on;
    the command then exits 1.

    \b
    Example:
      radixcache chat --system "You are a terse assistant." --max-tokens 64
      printf 'Hi!\\nWhat can you do?\\n' | radixcache chat --max-tokens 16
    """
    from radixcache.runtime.engine.engine import Engine

    if sys.stdin is None:  # `radixcache chat <&-`: no line could be read (it was an internal error after the load)
        fail("standard input is closed: chat reads one message per line from it (pipe or type them)")
    if sys.stdout is None:  # `radixcache chat >&-`: the replies had nowhere to go (an internal error too)
        fail("standard output is closed: chat writes its replies there (redirect it to a file instead)")
    kwargs = engine_choices.engine_kwargs(no_cache)
    engine = Engine(engine_choices.load_model(model), enable_cache=not no_cache, **kwargs)
    probe = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": "?"}]
    try:  # every turn renders with the model's chat template: without one, each line read was refused in turn
        engine.tokenizer.apply_chat_template(probe, add_generation_prompt=True)
    except EXPECTED as exc:
        engine.close()
        fail(f"cannot chat: {describe(exc)}")
    interactive = sys.stdin.isatty()
    shown = terminal_text if _to_terminal() else str
    if interactive:
        click.echo(f"chatting with {engine.config.name} ({COMMANDS})", err=True)
    # A live conversation: every turn's pages are read by the next one, whatever the admission policy predicts.
    turn_kwargs = {"max_new_tokens": max_tokens, "temperature": temperature, "retain": "conversation"}
    session = engine.session(system=system, **turn_kwargs)
    failed = 0  # turns refused (a message past the context, text the tokenizer cannot take): the chat goes on
    try:
        turn = 0
        while True:
            if interactive:
                click.echo(click.style("you> ", bold=True), nl=False)
            line = sys.stdin.readline()
            if not line:
                break
            text = line.strip()
            if text in ("/exit", "/quit"):
                break
            if text == "/reset":
                session = engine.session(system=system, **turn_kwargs)
                click.echo("(history cleared; the cache keeps what it holds)", err=True)
                continue
            if not text:
                continue
            try:
                result = session.send(text, seed=seed + turn)
            except EXPECTED as exc:  # the history is as before the turn: only a reply is appended, with it
                failed += 1
                click.echo(f"error: {one_line(describe(exc))} (this turn was dropped)", err=True)
                continue
            turn += 1
            click.echo(click.style("model> ", bold=True), nl=False)
            click.echo(shown(result.text), color=True)  # as it is shown: click drops CSI codes from a pipe's text
            stats = (
                f"[{result.cached_tokens} cached · {result.prefill_tokens} prefilled · "
                f"TTFT {result.ttft_s * 1000:.0f} ms · {result.decode_tps:.1f} tok/s]"
            )
            click.echo(click.style(stats, dim=True))
    finally:
        engine.close()  # the disk tier's queued writes finish before the process exits
    if failed:  # a script feeding the chat learns that some of its turns were refused
        raise click.exceptions.Exit(EXIT_ERROR)
