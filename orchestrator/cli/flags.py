"""Flags several commands share, and what they turn into: the Python API's keywords (``api.py``)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import logs
from ..config import SEED_MAX
from ..engines.load import BACKENDS
from ..errors import RolecastError
from ..launch import DTYPES

MODEL_HELP = "smollm2-135m (default), tiny, a local Hugging Face model dir, or a hub id (org/name)"
ENGINE_HELP = "generation backend: hf (default) or vllm (GPU only; pip install 'rolecast[vllm]')"
DEVICE_HELP = "auto (default: a CUDA GPU where there is one, else the CPU), cpu, cuda or cuda:N"
ADAPTER_HELP = "load a PEFT-format adapter dir (a run's sampler/NAME, say) as adapter NAME (repeatable)"
DTYPE_DEFAULT = "(default auto: bfloat16 where the CPU or GPU computes it natively, else float32)"
POLICY_HELP = "bind a role: replay:FILE, python:pkg.mod:fn, builtin:NAME, openai:MODEL@URL or model (repeatable)"


def _number(text: str, convert: type, what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: a whole number above 0 (0 or less is a mistake, never a request for a default)."""
    if (value := _number(text, int, "a whole number")) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a whole number, 0 or more (a count that may be none, or 0 for a default)."""
    if (value := _number(text, int, "a whole number")) < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def seed_number(text: str) -> int:
    """argparse type: a seed, 0 to 2**63 - 1 (the sampler draws from it as int64)."""
    if not 0 <= (value := _number(text, int, "a whole number")) <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"a seed is 0 to 2**63 - 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number above 0 (seconds, say)."""
    if not (value := _number(text, float, "a number")) > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def out_dir(text: str) -> Path:
    """argparse type: --out's folder; an empty one (``--out "$RUN"`` with RUN unset) would be the
    current folder, the run's files strewn among the user's."""
    if not text:
        raise argparse.ArgumentTypeError("empty: give a folder (. for the current one)")
    return Path(text)


def add_model_flags(p: argparse.ArgumentParser, *, model_default: str | None = None,
                    adapter_help: str | None = ADAPTER_HELP, dtype_help: str = "the model's weights " + DTYPE_DEFAULT) -> None:
    """--model, --dtype, --engine, --device, and --adapter unless ``adapter_help`` is None."""
    p.add_argument("--model", default=model_default, help=MODEL_HELP)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help=dtype_help)
    p.add_argument("--engine", default="hf", choices=BACKENDS, help=ENGINE_HELP)
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if adapter_help is not None:
        p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help=adapter_help)


def add_episode_flags(p: argparse.ArgumentParser, json_help: str) -> None:
    """--seed, --concurrency, --timeout, --json and --no-progress: how a command plays its episodes."""
    p.add_argument("--seed", type=seed_number, help="run seed (default: the team's `seed`)")
    p.add_argument("--concurrency", type=positive_int, help="episodes in flight at once (default: the team's `concurrency`)")
    p.add_argument("--timeout", type=positive_float, help="per-episode timeout in seconds (default: the team's `episode_timeout_s`)")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def shows_progress(args: argparse.Namespace) -> bool:
    """Whether a command draws its progress bar: not with --no-progress, nor with --log-json, whose
    stderr holds JSON lines only."""
    return not (args.no_progress or args.log_json)


def add_policy_flag(p: argparse.ArgumentParser, help: str = POLICY_HELP) -> None:
    p.add_argument("--policy", action="append", default=[], metavar="ROLE=BINDING", help=help)


def parse_policy_flags(flags: list[str]) -> dict[str, str]:
    """``--policy ROLE=BINDING`` flags as the API's ``policies`` (role -> binding text)."""
    return _pairs(flags, "--policy", "expected ROLE=BINDING, e.g. judge=replay:judge.jsonl")


def parse_adapter_flags(flags: list[str]) -> dict[str, str]:
    """``--adapter NAME=PATH`` flags as the API's ``adapters``, each NAME once."""
    return _pairs(flags, "--adapter", "expected NAME=PATH to a PEFT adapter dir (with adapter_config.json)")


def _pairs(flags: list[str], flag: str, expected: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in flags:
        key, sep, value = text.partition("=")
        if not sep or not key or not value:
            raise RolecastError(f"{flag} {text!r}: {expected}")
        if key in out:
            raise RolecastError(f"{flag} {key}: given twice ({out[key]} and {value})")
        out[key] = value
    return out


def compute_options(args: argparse.Namespace) -> dict[str, Any]:
    """--model, --dtype, --engine, --device and the Ray flags as the API's keywords."""
    return {"model": args.model, "dtype": args.dtype, "engine": args.engine, "device": args.device,
            "ray": getattr(args, "ray", None), "rollout_workers": getattr(args, "rollout_workers", None)}


def exit_code(result: Any) -> int:
    """1, with the first error on stderr, when every episode of ``result`` failed or timed out (its
    table of zeros would read as a result); else 0."""
    from ..rollout import every_episode_failed

    if first := every_episode_failed(result.episodes):
        logs.say(f"rolecast: every episode failed; the first: {first.error}", "error")
        return 1
    return 0


def stdout_console() -> Any:
    """A rich Console on stdout whose broken pipe (``| head -1``) reaches ``main`` (exit 141): rich's own
    handler exits 1, which says the run failed."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipedConsole()


def statuses(summary: dict[str, Any]) -> str:
    """A run's episode statuses as "ok 7, timeout 1" (not the dict's repr)."""
    return ", ".join(f"{status} {count}" for status, count in summary["status"].items())


def episodes_title(summary: dict[str, Any]) -> str:
    """"team: N episodes (ok 7, timeout 1)": a run's or an evaluation's table title."""
    n = summary["episodes"]
    return f"{summary['team']}: {n} episode{'s' * (n != 1)} ({statuses(summary)})"


def print_table(console: Any, table: Any) -> None:
    """``table`` on ``console``, wider than the console where its columns need more: a no_wrap
    column whole, a folding one as wide as its min_width. Rich cut them to fit ('0.150-0.', and
    'player-1…' for player-1@2) and gave some no width at all; a table the terminal wraps still
    shows every figure, and one in a file or ``less -S`` reads as printed."""
    from rich.measure import Measurement
    from rich.padding import Padding

    wide = console.options.update_width(1 << 16)
    for column in table.columns:
        if column.no_wrap:
            column.min_width = max(Measurement.get(console, wide, cell).maximum for cell in (column.header, *column.cells))
    _, right, _, left = Padding.unpack(table.padding)
    width = console.width
    borders = (2 if table.box and table.show_edge else 0) + (len(table.columns) - 1 if table.box else 0)
    needs = sum((c.min_width or 1) + left + right for c in table.columns) + borders
    console.width = max(width, needs)
    try:
        console.print(table)
    finally:
        console.width = width


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """--model, --dtype, --engine, --device, --set, --seed, --no-progress and the Ray flags: how a
    command trains."""
    add_model_flags(p, adapter_help=None, dtype_help="the engine's weights when sampling " + DTYPE_DEFAULT)
    add_set_flag(p)
    p.add_argument("--seed", type=seed_number, help="run seed (default: the recipe's `seed`)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_ray_flags(p)


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="play episodes on Ray rollout workers: `local` (default) starts Ray here; "
                        "an address (auto, ray://host:10001) joins a cluster (pip install 'rolecast[ray]')")
    p.add_argument("--rollout-workers", type=positive_int, metavar="N",
                   help="--ray: rollout workers, each with its own engine (default 2)")


def add_set_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                   help="change a training option for this run: group_size=4, eval_episodes=8, adam.learning_rate=1e-4, "
                        "trainer_config.members=8 ... (repeatable)")


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` flags as the API's ``sets`` (each VALUE read as YAML); the keys and
    values are checked when they are applied (``team.with_training_options``)."""
    import yaml

    from ..yamlfile import read_value

    options: dict[str, Any] = {}
    for flag in sets:
        key, sep, raw = flag.partition("=")
        if not sep or not key:
            raise RolecastError(f"--set {flag!r}: expected KEY=VALUE, e.g. group_size=4 or adam.learning_rate=1e-4")
        try:
            options[key] = read_value(raw)
        except yaml.YAMLError as exc:
            raise RolecastError(f"--set {flag!r}: VALUE is not YAML ({type(exc).__name__})") from None
    return options
