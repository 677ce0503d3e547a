"""What ``run``, ``evaluate`` and ``train`` set up before they play, for the Python API
(``api.py``) and the commands alike: role bindings, adapter dirs, run dirs, and the engine or Ray
rollout workers that play. Errors name the command-line flag a value came from (``--policy``,
``--adapter``, ``--out``), which is also the keyword's name in the API."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engines.load import BACKENDS
from .errors import RolecastError
from .files import writing
from .policies.binding import Binding, parse_binding
from .registry import default_registry

DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class Compute:
    """Where and how the model runs: ``--model``, ``--dtype``, ``--engine``, ``--device``, and with
    ``ray`` (``local`` or a cluster address) that many Ray rollout workers instead of this process."""

    model: str | None = None  # None: the team's `model`
    dtype: str = "auto"
    engine: str = "hf"
    device: str = "auto"
    ray: str | None = None
    rollout_workers: int | None = None  # None: 2 where there is `ray`

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):  # a local model dir as a Path: config.yaml records text
            object.__setattr__(self, "model", os.fspath(self.model))
        # "" too (--model "$MODEL" unset): it fell back to the team's model, said nowhere
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise RolecastError(f"--model {self.model!r}: give a model name, a local model dir or a hub id")
        if self.dtype not in DTYPES:
            raise RolecastError(f"--dtype {self.dtype}: use one of {', '.join(DTYPES)}")
        if self.engine not in BACKENDS:
            raise RolecastError(f"--engine {self.engine}: use one of {', '.join(BACKENDS)}")
        if self.ray is not None and not isinstance(self.ray, str):  # ray=True, as the bare flag reads
            raise RolecastError(f"--ray {self.ray!r}: give local, or a cluster address (auto, ray://host:10001)")
        if self.rollout_workers is None:
            return
        if not isinstance(self.rollout_workers, int) or isinstance(self.rollout_workers, bool) or self.rollout_workers < 1:
            raise RolecastError(f"--rollout-workers {self.rollout_workers}: must be a whole number of at least 1")
        if self.ray is None:  # else the run would play in this process, and say nothing
            raise RolecastError(f"--rollout-workers {self.rollout_workers}: rollout workers are Ray's; add --ray (local, "
                                "or a cluster address)")

    def workers(self, model: str, seed: int, lora_rank: int = 0) -> Any:
        """The Ray rollout workers ``ray`` asks for, or None. On CUDA each gets a GPU of its own;
        ``lora_rank``: that of the adapters training will give them."""
        if self.ray is None:
            return None
        from .workers import RayOptions, RayRollouts

        cuda = str(self.device).startswith("cuda")
        if self.engine == "vllm" and not cuda:  # said here, not as a worker's death minutes later
            raise RolecastError("--ray with --engine vllm needs --device cuda: each worker runs vLLM on a GPU of its own")
        options = RayOptions(address=self.ray, workers=self.rollout_workers or 2, gpus_per_worker=1.0 if cuda else 0.0)
        # Ray shows each GPU worker its own GPU alone, as cuda:0: a driver's cuda:N is no device there
        return RayRollouts(options, model=model, dtype=self.dtype, seed=seed, backend=self.engine,
                           device="cuda" if cuda else "cpu", lora_rank=lora_rank)


def bindings(policies: Mapping[str, str | Binding | Callable[..., Any]] | None) -> dict[str, Binding]:
    """Role -> binding: the text ``--policy ROLE=BINDING`` takes (``replay:FILE`` relative to the
    current folder, ``builtin:NAME``, ...), a Binding, or a Python callable (``fn(request) -> str``,
    sync or async), each checked here (a missing file or plugin is one line, not a failed episode)."""
    out: dict[str, Binding] = {}
    registry = default_registry()
    for role, value in (policies or {}).items():
        try:
            if callable(value) and not isinstance(value, Binding):
                binding = Binding("python", f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', repr(value))}",
                                  fn=value)
            elif isinstance(value, Binding):
                binding = value
            else:
                binding = parse_binding(str(value), base_dir=Path.cwd())
            binding.check(registry)
        except ValueError as exc:
            raise RolecastError(f"--policy {role}={value}: {exc}") from None
        out[role] = binding
    return out


def adapter_dirs(adapters: Mapping[str, str | Path] | None) -> dict[str, Path]:
    """Name -> PEFT adapter dir (``--adapter NAME=PATH``), each with a config that reads and its
    weights beside it (checked here, not as a traceback when the engine loads it)."""
    out: dict[str, Path] = {}
    for name, path in (adapters or {}).items():
        flag = f"--adapter {name}={path}"
        if not name or not Path(path, "adapter_config.json").is_file():
            raise RolecastError(f"{flag}: expected NAME=PATH to a PEFT adapter dir (with adapter_config.json)")
        try:
            config = json.loads(Path(path, "adapter_config.json").read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise RolecastError(f"{flag}: cannot read its adapter_config.json: {exc}") from None
        if not isinstance(config, dict):
            raise RolecastError(f"{flag}: its adapter_config.json is not a JSON object")
        if not any(Path(path, f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
            raise RolecastError(f"{flag}: no adapter_model.safetensors (or .bin) beside its config")
        out[name] = Path(path)
    return out


def check_adapter_names(adapters: Mapping[str, Path], team: Any) -> None:
    """Every adapter NAME is one a role of ``team`` plays: a misspelt one would leave that role on
    the base model while the table names the adapter."""
    played = sorted({spec.config.policy.adapter for spec in team.roles.values()} - {None})
    for name in adapters:
        if name not in played:
            raise RolecastError(f"--adapter {name}: no role of {team.name} plays adapter {name!r} "
                                f"(its roles' adapters: {', '.join(played) or 'none'})")


_naming, _named = threading.Lock(), set()  # the default run dirs this process has handed out


def run_dir(out: str | Path | None, stem: str, fresh: bool = False) -> Path:
    """``out``, or ``runs/<stem>-<time>`` (``-2``, ``-3`` ... after it where runs started in the
    same second: calls in a loop); a path through an existing file is one line here, not a
    traceback when the run first writes. ``fresh``: an ``out`` that already holds a run (its
    config.yaml) is refused too, rather than overwritten."""
    if out is None:  # checked as a given one is: a file named runs here was a traceback at the first write
        out = base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        with _naming:  # calls in threads (asyncio.to_thread) see no folder of each other's yet: one name each
            while out.exists() or out.absolute() in _named:
                n += 1
                out = base.with_name(f"{base.name}-{n}")
            _named.add(out.absolute())
    out = Path(out)
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise RolecastError(f"--out {out}: {blocker} is a file, not a folder")
    if fresh and (out / "config.yaml").exists():
        raise RolecastError(f"--out {out} already holds a run: give another --out, or remove it first")
    _check_creatable(out)
    return out


def _check_creatable(out: Path) -> None:
    """A folder that cannot be made (a read-only or special file system) is one line now, not a
    traceback when the run first writes, after the model has loaded. The probe leaves nothing."""
    missing = [p for p in (out, *out.parents) if not p.exists()]  # the deepest first
    if not missing:
        return
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise RolecastError(f"--out {out}: cannot make this folder ({exc.strerror or exc})") from None
    for folder in missing:
        try:
            folder.rmdir()
        except OSError:  # a run started beside this one made its folder in it meanwhile: it stays
            break


LOCK_FILE = ".rolecast.lock"


@contextlib.contextmanager
def claimed(out: Path) -> Iterator[None]:
    """Hold the run dir ``out`` for this run alone while the block runs: a second process (or
    call) writing it would interleave its metrics, checkpoints and transcripts. An exclusive flock
    on ``out/.rolecast.lock``, which the OS releases when a process dies (a killed run resumes);
    the lock file goes at the end, and the folders made for it where the run wrote nothing."""
    made = [p for p in (out, *out.parents) if not p.exists()]  # the deepest first
    lock = out / LOCK_FILE
    while True:
        out.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RolecastError(f"{out}: cannot make its lock file ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"  # "": it has not written it yet
            os.close(fd)
            raise RolecastError(f"{out} is in use by another rolecast process (pid {holder}): wait for it or give "
                                "another --out") from None
        except OSError as exc:  # a file system without flock (Lustre without its mount option): run as before it
            import structlog

            structlog.get_logger().warning("cannot lock the run dir: nothing stops another process writing it too",
                                           out=str(out), error=exc.strerror)
            break
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                break
        os.close(fd)  # locked a file its holder removed as it let go: lock the one at the path now
    try:
        with writing(lock):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)  # while still held: a process that opened it meanwhile finds it gone, and opens anew
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # the run wrote in it
                break
        os.close(fd)


def recorded_run(out: Path) -> dict[str, Any] | None:
    """What ``out/config.yaml`` records of the run there (its ``recipe`` and ``run`` mappings);
    None where there is none, and a damaged one is one line, not a traceback."""
    import yaml

    from .files import read_yaml

    path = out / "config.yaml"
    if not path.is_file():
        return None
    try:
        data = read_yaml(path) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RolecastError(f"{path} is unreadable ({type(exc).__name__}): is {out} a rolecast run?") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k) or {}, dict) for k in ("recipe", "run")):
        raise RolecastError(f"{path} is not a run's config (a mapping of recipe and run): is {out} a rolecast run?")
    return data


def policies_and_workers(compute: Compute, team: Any, overrides: dict[str, Binding], model: str, seed: int,
                         adapters: dict[str, Path], extra_adapters: dict[str, Path] | None = None) -> tuple[dict, Any]:
    """The policies that play ``team`` here, loading the engine with ``adapters`` when a role needs
    it; or, with Ray, rollout workers holding the adapters (the policies then only check the
    bindings)."""
    from .engines.load import adapter_rank, load_engine
    from .rollout import build_policies

    check_adapter_names(adapters, team)
    adapters = {**adapters, **(extra_adapters or {})}
    # sized for the adapters, as load_engine sizes its own: vLLM's slots would stop at rank 64
    workers = compute.workers(model, seed, max(map(adapter_rank, adapters.values()), default=0))
    if workers is None:
        return build_policies(team, overrides, lambda: load_engine(model, compute.dtype, seed, compute.engine, adapters,
                                                                   compute.device)), None
    with closed_on_error(workers):
        for name, path in adapters.items():
            workers.publish(name, path, 1)
        return build_policies(team, overrides, lambda: None), workers


@contextlib.contextmanager
def closed_on_error(workers: Any) -> Iterator[None]:
    """Close the Ray rollout workers (and Ray, where they started it) when the block fails: else
    they outlive the error, and a later call in the same process would find that Ray running."""
    try:
        yield
    except BaseException:
        if workers is not None:
            workers.close()
        raise


async def play(team: Any, policies: dict[str, Any], options: Any, workers: Any = None,
               overrides: dict[str, Binding] | None = None) -> Any:
    """``run_team`` to the end (on ``workers``, when given, with ``options.concurrency`` episodes in
    flight on each), then close each engine the policies use, once, and the workers."""
    import dataclasses

    from .rollout import run_team

    try:
        if workers is not None:
            options = dataclasses.replace(options, play=workers.bind(team, overrides or {}),
                                          concurrency=options.concurrency * workers.workers)
        return await run_team(team, policies, options)
    finally:
        engines = {id(p.engine): p.engine for p in policies.values() if getattr(p, "engine", None) is not None}
        for engine in engines.values():
            await engine.aclose()
        if workers is not None:
            workers.close()
