"""The default backend: Hugging Face transformers on the CPU or a CUDA GPU, many LoRA adapters.

Requests from every concurrent episode and role go into one queue. A scheduler serves them with
continuous batching, one iteration at a time on the process's compute thread (``compute_thread.py``:
the trainer's jobs run there too, between iterations): each iteration prefills the newcomers
(together), appends their KV cache to the running batch, then advances every running sequence
by one token in a single forward pass (``decoder.py`` writes that step out for Llama-shaped
models; others step through transformers' forward). On a GPU the step runs over a static KV cache
(``slots.py``) and is replayed from CUDA graphs (``graphs.py``): the static path. Sequences leave the batch as soon as they
finish, and waiting requests take their place, so a short reply never waits for the longest one.
Rows of one forward pass may use different adapters (``lora.MultiLoRA``: rows routed to their
adapter once per forward pass).

Adapters can be added, loaded, updated and removed while the engine runs; changes are applied
between scheduler iterations, and every change bumps the adapter's version, which each
completion reports.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import structlog
import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from ..compute_thread import compute_thread
from ..cpu import CpuFeatures
from ..grammar.book import ConstrainedRow, GrammarBook, book_for
from ..models import LoadedModel, kv_cache_name
from ..padding import length_batches
from .attention import use_decode_attention
from .base import AdapterVersions, Completion, GenerationRequest, RequestRefused, cut_at_stop
from .decoder import FusedDecoder
from .graphs import CaptureRefused, StepGraphs, rows_bucket, window_bucket
from .kv import BatchKV
from .lora import NO_LORA, MultiLoRA, SlotLoRA
from .prefix_cache import BLOCK, PrefixCache, shared_prefixes
from .sampling import counter_uniforms, sample_on_device, top_logprobs
from .slots import SlotKV
from .tokens import TokenizerMethods, end_of_turn_ids
from ..upload import Download, upload

log = structlog.get_logger()

# Prompt tokens a row feeds per prefill pass on the static path: bounds a pass's attention scores
# ([rows, heads, chunk, columns]); a longer rest takes more passes.
_PREFILL_CHUNK = 512
# Rests this short (a multi-turn episode's next turn) prefill in a step over every slot, replayed
# from a CUDA graph per width bucket (8, 16, 32, 64 tokens): ``HFEngine._prefill_in_step``.
_STEP_PREFILL = 64

BASE = "__base__"


@dataclass(eq=False)
class _Seq:
    request: GenerationRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    seed: int  # the i-th draw's uniform is counter_uniforms(seed, i): no generator state to keep
    draws: int = 0
    adapter_key: str = BASE  # set at prefill, under the lock, with the version it samples from
    adapter_version: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # where sampling.top_logprobs asks
    cancelled: bool = False
    done: Completion | None = None
    grammar: ConstrainedRow | None = None  # set when the request has a json_schema

    @property
    def cache_key(self) -> tuple[str, int]:
        return self.adapter_key, self.adapter_version


@dataclass
class _Flight:
    """A static-path step whose sampled tokens the host has not read yet: they feed the next step
    on the device while they travel to the host (``upload.Download``)."""

    seqs: list[_Seq]  # its rows, in the order they had when it was launched
    tokens: torch.Tensor  # sampled ids on the device [rows]
    host: Download  # ids and logprobs (and the top ones' ids and logprobs, where asked) arriving on the host

    @classmethod
    def launch(cls, seqs: list[_Seq], tokens: torch.Tensor, *rest: torch.Tensor) -> "_Flight":
        return cls(seqs, tokens, Download([tokens, *rest]))

    def read(self) -> tuple[list, ...]:
        return tuple(t.tolist() for t in self.host.get())


@dataclass
class EngineStats:
    """Where the scheduler's time went (seconds) and what it produced, since the engine started.

    ``decode_tokens / decode_s`` is the decode rate with prefill left out; ``grammar_s`` is the
    part of prefill and decode spent on schema masks and length budgets.
    """

    prefill_s: float = 0.0
    prefill_passes: int = 0  # forward passes that prefilled (a pass's fixed cost is its launches on a GPU)
    prefill_tokens: int = 0  # prompt tokens computed (padding and reused prefixes excluded)
    prefix_hit_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    decode_s: float = 0.0
    decode_steps: int = 0
    decode_tokens: int = 0  # one per running row per step
    grammar_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class HFEngine(TokenizerMethods, AdapterVersions):
    def __init__(self, loaded: LoadedModel, max_batch: int | None = None, max_prefill: int | None = None,
                 prefix_cache_tokens: int = 16384, fused_decode: bool = True, cpu: CpuFeatures | None = None,
                 static: bool | None = None, cuda_graphs: bool = True, share_prefixes: bool = True,
                 fused_prefill: bool = True, pass_tokens: int | None = None):
        """``max_batch`` rows decode together (default 64 on the CPU, 256 on a GPU), ``max_prefill``
        newcomers prefill together (default 16 on the CPU, all that fit on a GPU), their common
        prefixes computed once with ``share_prefixes`` (needs the prefix cache) in a pass of their
        own where that saves more than ``pass_tokens`` tokens of prefill (a pass's fixed cost:
        default 0 on the CPU, 4,096 on a GPU, where a pass costs its launches). ``static``: the
        static path (default: on a GPU, for Llama-shaped models), with its steps replayed from CUDA
        graphs unless ``cuda_graphs`` is False (or on the CPU, where it runs eagerly: for tests),
        and its newcomers prefilled by the fused step unless ``fused_prefill`` is False
        (transformers' forward then, as off the static path)."""
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        supported = fused_decode and FusedDecoder.supports(self.model)
        if static and not supported:  # before the hooks go on: a refused engine leaves the model free
            raise ValueError("the static decode path needs a Llama-shaped model and fused_decode")
        self.lora = MultiLoRA(self.model)
        self._cache_name = kv_cache_name(self.model)
        self.device = self.lora.device  # the model's: its KV cache, batches and sampling live there too
        gpu = self.device.type == "cuda"
        self.max_batch = max_batch or (256 if gpu else 64)
        self.max_prefill = max_prefill or (self.max_batch if gpu else 16)
        use_decode_attention(self.model)  # decode steps: two matmuls instead of SDPA's kernel
        self.fused_decode = fused_decode  # decoder.py's step where the model's shape allows (read every step)
        self.static = supported if static is None and gpu else bool(static)
        self.cuda_graphs = cuda_graphs and gpu and self.static
        self.fused_prefill = fused_prefill  # read at each prefill: a benchmark may switch it
        self._cpu = cpu  # the CPU the fused step lays its weights out for (None: this machine's; cpu.py)
        AdapterVersions.__init__(self)
        self.eos_ids = end_of_turn_ids(self.tokenizer)
        self._pending: queue.Queue[_Seq] = queue.Queue()
        self._lock = threading.RLock()  # held by a scheduler iteration and by adapter changes
        self._compute = compute_thread()
        self._closed = False
        self._serving = False  # the scheduler's step is on the compute thread
        self._stopped = threading.Event()
        self._active: list[_Seq] = []
        self._flight: _Flight | None = None  # the static path's step in flight
        self._kv = SlotKV(self.device, self.max_batch) if self.static else BatchKV(self.device)
        if self.static:
            self._slots = SlotLoRA(self.lora, self.max_batch)
            self._ids = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)  # the step's input
            self._graphs = StepGraphs(self._static_forward, self.device) if gpu else None
            # short rests prefill in a step over every slot, its inputs in buffers that never move
            self.step_prefill = gpu  # (the CPU runs it eagerly where a test asks)
            self._chunk_ids = torch.zeros(self.max_batch, _STEP_PREFILL, dtype=torch.long, device=self.device)
            self._chunk_last = torch.zeros(self.max_batch, dtype=torch.long, device=self.device)
            self._chunk_graphs = StepGraphs(self._chunk_forward, self.device) if gpu else None
        self._warned: set[str] = set()
        self.stats = EngineStats()
        # transformers masks a sliding window by cache column, and a prefix hit's row is padded
        # between its cached prefix and the rest of its prompt: its keys lie further apart than its
        # tokens, and the window would hide some it must read. Without the prefix cache, and within
        # the window (context_length), the window hides nothing.
        self.sliding_window = getattr(self.model.config, "sliding_window", None)
        if self.sliding_window is not None and prefix_cache_tokens > 0:
            log.info("engine.prefix_cache_off", sliding_window=self.sliding_window)
            prefix_cache_tokens = 0
        # KV of finished sequences, reused by prompts that start the same way (0 turns it off)
        self._prefix = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self.share_prefixes = share_prefixes
        self.pass_tokens = (4096 if gpu else 0) if pass_tokens is None else pass_tokens

    # -- the Engine interface ------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> Completion:
        if self._closed:
            raise RuntimeError("the engine is closed")
        request = self._fit(request)
        loop = asyncio.get_running_loop()
        seed = request.sampling.seed
        seq = _Seq(request=request, future=loop.create_future(), loop=loop,
                   seed=seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        if request.json_schema:  # compiling a new schema can take a second: off the event loop
            seq.grammar = await asyncio.to_thread(self._constrained_row, request)
            if self._closed:  # closed while it compiled: aclose emptied the queue already, none would answer
                raise RuntimeError("the engine is closed")
        self._start()
        self._pending.put(seq)
        self._compute.wake()
        try:
            return await seq.future
        except asyncio.CancelledError:
            seq.cancelled = True  # the scheduler drops it at its next iteration
            self._compute.wake()
            raise

    def _fit(self, request: GenerationRequest) -> GenerationRequest:
        """Refuse a prompt the model could only fail on mid-batch, taking its neighbours' rows along,
        or that fills its context; a reply that would run past the context ends there (``length``)."""
        ids = request.prompt_ids
        if not ids:
            raise RequestRefused("the prompt is empty: a request needs at least one prompt token")
        vocab = self.model.get_input_embeddings().num_embeddings
        if min(ids) < 0 or max(ids) >= vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise RequestRefused(f"prompt token id {bad} is outside the model's vocabulary (0 to {vocab - 1})")
        limit = self.context_length  # positions past it are ones the model never learnt: replies there are noise
        if limit is not None and len(ids) >= limit:
            raise RequestRefused(f"the prompt ({len(ids)} tokens) leaves no room for a reply in the model's context "
                             f"of {limit} tokens")
        if limit is not None and len(ids) + request.sampling.max_tokens > limit:
            request = replace(request, sampling=replace(request.sampling, max_tokens=limit - len(ids)))
        return request

    async def aclose(self) -> None:
        self._closed = True
        self._compute.wake()
        if self._serving:
            await asyncio.to_thread(self._stopped.wait)
        while not self._pending.empty():
            self._fail(self._pending.get_nowait(), RuntimeError("the engine was closed"))
        self.lora.detach()

    @property
    def decode_path(self) -> str:
        """``static:graphs`` (or ``static:eager``) on the static path; else ``fused:LAYOUT`` when decode
        steps run ``decoder.py``'s step (LAYOUT: its weights' layout, ``onednn``, ``onednn-fp32`` or
        ``plain``), ``transformers`` when they run the model's forward."""
        if self.static:
            return "static:graphs" if self.cuda_graphs else "static:eager"
        if not self.fused_decode or self._fused is None:
            return "transformers"
        return f"fused:{self._fused.layout}"

    @property
    def cpu(self) -> CpuFeatures | None:
        return self._cpu

    @cpu.setter
    def cpu(self, cpu: CpuFeatures | None) -> None:
        """Lay the fused step's weights out for another CPU's features (the next decode step repacks)."""
        with self._lock:
            self._cpu = cpu
            self.__dict__.pop("_fused", None)
            if self.cuda_graphs:  # captured graphs replay the old step's weights
                self._graphs = StepGraphs(self._static_forward, self.device)
                self._chunk_graphs = StepGraphs(self._chunk_forward, self.device)

    @property
    def context_length(self) -> int | None:
        """Positions the model was trained for (prompt and reply together), if its config says; for
        a model with a sliding window, no more than the window (the engine does not slide it). A
        longrope model (Phi-3 128k) gets its original window: past it transformers switches every
        position's rotary to the long factors, which keys already cached, and the batch's shorter
        rows, cannot follow (their logprobs were off teacher forcing's)."""
        config = self.model.config
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        if rope.get("rope_type", rope.get("type")) == "longrope":
            trained = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
        else:
            trained = getattr(config, "max_position_embeddings", None)
        return min([n for n in (trained, self.sliding_window) if n], default=None)

    @property
    def busy(self) -> int:
        """Requests queued or running (0 when nothing is stuck); one cancelled in the queue is neither,
        though it waits there for a free row to be dropped."""
        with self._pending.mutex:
            queued = sum(not s.cancelled for s in self._pending.queue)
        return queued + len(self._active)

    # -- adapters ------------------------------------------------------------------------------
    def adapter_version(self, name: str) -> int:
        return self.versions.get(name, 0)

    def add_adapter(self, name: str) -> int:
        """A fresh adapter (B = 0: it samples exactly like the base model until trained)."""
        with self._lock:
            self.lora.set_empty(name)
            return self._bump(name)

    def load_adapter(self, name: str, path: str | Path) -> int:
        """Load PEFT-format weights from ``path``: a new adapter, or new weights for an old one."""
        with self._lock:
            self.lora.load(name, path)
            return self._bump(name)

    def update_adapter(self, name: str, state_dict: dict[str, torch.Tensor], scale: float = 1.0) -> int:
        """Replace an adapter's weights (PEFT key format; B is multiplied by ``scale`` = alpha / r)."""
        with self._lock:
            if name not in self.lora.adapters:
                raise KeyError(f"no adapter {name!r} to update (add or load it first)")
            self.lora.set_state(name, state_dict, scale)
            return self._bump(name)

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self.lora.adapters:
                raise KeyError(f"no adapter {name!r}")
            self.lora.remove(name)
            self.forget_version(name)
            if self._prefix is not None:
                self._prefix.drop(name)

    def _bump(self, name: str) -> int:
        if self._prefix is not None:
            self._prefix.drop(name)
        self.versions[name] = self.next_version(name)
        return self.versions[name]

    def _adapter_key(self, name: str | None) -> str:
        if name is None or name in self.lora.adapters:
            return name or BASE
        if name not in self._warned:
            self._warned.add(name)
            log.info("engine.adapter_not_loaded", adapter=name, note="sampling from the base model (version 0)")
        return BASE

    # -- teacher forcing (for checks) ----------------------------------------------------------
    @torch.inference_mode()
    def teacher_forced_logprobs(
        self, prompt_ids: list[int], completion_ids: list[int], adapter: str | None = None, temperature: float = 1.0
    ) -> list[float]:
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=self.device)
        with self._lock:
            logits = self._forward(ids, torch.ones_like(ids), None, [self._adapter_key(adapter)]).logits[0].float()
        scaled = logits / (temperature if temperature > 0 else 1.0)
        logp = torch.log_softmax(scaled[len(prompt_ids) - 1 : -1], dim=-1)
        return logp.gather(-1, torch.tensor(completion_ids, device=self.device)[:, None]).squeeze(-1).tolist()

    # -- the scheduler -------------------------------------------------------------------------
    def _start(self) -> None:
        if not self._serving:
            self._serving = True
            self._compute.add_loop(self._step)

    def _step(self) -> bool:
        """One scheduler iteration: admit newcomers, prefill them, advance every running row."""
        if self._closed:
            for seq in self._active:
                self._fail(seq, RuntimeError("the engine was closed"))
            self._active, self._flight = [], None
            self._compute.remove_loop(self._step)
            self._stopped.set()
            return False
        newcomers = self._admit()
        if not newcomers and not self._active and self._flight is None:
            return False
        try:
            with self._lock, torch.inference_mode():
                if self.static:
                    self._static_iteration(newcomers)
                else:
                    if newcomers:
                        self._prefill(newcomers)
                    if self._active:
                        self._decode()
        except Exception as exc:  # a model fault fails the requests in flight, not the engine
            log.error("engine.step_failed", error=f"{type(exc).__name__}: {exc}")
            for seq in dict.fromkeys(self._active + newcomers):  # prefilled newcomers are in both
                self._fail(seq, exc)
            self._active, self._flight = [], None
            self._kv.keep([])
        return True

    def _static_iteration(self, newcomers: list[_Seq]) -> None:
        """The static path runs one step ahead of the host: step t+1 is launched with step t's
        tokens straight from the device, and the host reads and books step t (new tokens, grammar
        state, stops) while the device computes step t+1. A row that step t finished has its step
        t+1 computed and ignored. What each request samples is what the sequential order samples:
        the same logits, the same per-request uniforms."""
        flight, self._flight = self._flight, None
        if newcomers:
            self._prefill(newcomers)  # their first tokens, on the host now
        launched, logits = list(self._active), None
        if launched:
            t0 = time.perf_counter()
            logits = self._static_step([s.adapter_key for s in launched], self._next_ids(launched, flight))
            self.stats.decode_s += time.perf_counter() - t0
        if flight is not None:
            self._apply(flight.seqs, *flight.read())  # while the device runs the step just launched
        if launched:
            t0 = time.perf_counter()
            self._flight = _Flight.launch(launched, *self._sample(launched, logits))
            self._kv.advance()
            self.stats.decode_s += time.perf_counter() - t0
            self.stats.decode_steps += 1
            self.stats.decode_tokens += len(launched)
        self._retire()

    def _next_ids(self, rows: list[_Seq], flight: _Flight | None) -> torch.Tensor:
        """Each row's last token, on the device: from the step in flight where the row was in it
        (not read by the host yet), else from the host (rows prefilled since)."""
        if flight is None:
            return upload([s.tokens[-1] for s in rows], self.device)
        where = {id(s): i for i, s in enumerate(flight.seqs)}
        src = [where.get(id(s), -1) for s in rows]
        if src == list(range(len(rows))):  # the usual step: same rows, same order, nothing from the host
            return flight.tokens[: len(rows)]
        ids = upload([s.tokens[-1] for s in rows], self.device)
        index = upload(src, self.device)
        return torch.where(index >= 0, flight.tokens[index.clamp(min=0)], ids)

    def _admit(self) -> list[_Seq]:
        room = min(self.max_batch - len(self._active), self.max_prefill)
        out: list[_Seq] = []
        while len(out) < room:
            try:
                seq = self._pending.get_nowait()
            except queue.Empty:
                break
            if seq.cancelled or seq.future.done():
                continue
            out.append(seq)
        return out

    def _forward(self, ids, mask, cache, adapters: list[str], positions=None, keep_last: bool = False):
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "use_cache": cache is not None or keep_last}
        if cache is not None:
            kwargs[self._cache_name] = cache
        if positions is not None:
            kwargs["position_ids"] = positions
        if keep_last:
            kwargs["logits_to_keep"] = 1
        with self._routed(adapters):
            return self.model(**kwargs)

    @contextlib.contextmanager
    def _routed(self, adapters: list[str]) -> Iterator[None]:
        """Each row's adapter for the passes inside, and none after: the modules' hooks stay on the
        model, and a shared training service (``ServiceClient.for_engine`` on a GPU) runs its own
        passes through the same modules between the engine's, where a stale route would add the
        engine's deltas (and its inference tensors to autograd's graph)."""
        self.lora.route([None if a == BASE else a for a in adapters])
        try:
            yield
        finally:
            self.lora.route([])

    def _prefill(self, seqs: list[_Seq]) -> None:
        """Prefill newcomers: each row's cached prefix (if any) comes from the prefix cache, the
        rest of its prompt goes through the model, in batches of rows whose rests are alike in
        length (``padding.length_batches``): a row's padding is computed like real tokens, so one long
        rest in a batch would cost every cache hit in it its savings."""
        t0 = time.perf_counter()
        for s in seqs:
            s.adapter_key = self._adapter_key(s.request.adapter)
            s.adapter_version = 0 if s.adapter_key == BASE else self.versions[s.adapter_key]
        if self._prefix is not None and self.share_prefixes:
            self._share_prefixes(seqs)
        hits = [self._prefix.lookup(s.request.prompt_ids, s.cache_key) if self._prefix else (0, None) for s in seqs]
        if self.static and self.fused_prefill:
            self._prefill_slots(seqs, hits)
        else:
            for batch in length_batches([len(s.request.prompt_ids) - n for s, (n, _) in zip(seqs, hits)]):
                self._prefill_rows([seqs[i] for i in batch], [hits[i] for i in batch])
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prefix_hit_tokens += sum(n for n, _ in hits)

    def _prefill_rows(self, seqs: list[_Seq], hits: list[tuple[int, Any]]) -> None:
        """One forward over ``seqs``; their keys and values join the batch, their first tokens are sampled."""
        out, mask, cached = self._forward_rests([s.request.prompt_ids for s in seqs], [s.adapter_key for s in seqs], hits)
        self._kv.append(getattr(out, self._cache_name), mask)
        self._active += seqs
        self._take(seqs, out.logits[:, -1])
        self.stats.prefill_tokens += int(mask[:, cached:].sum())

    def _prefill_slots(self, seqs: list[_Seq], hits: list[tuple[int, Any]]) -> None:
        """The static path's prefill: newcomers take fresh slots with their cached prefixes copied
        in (``SlotKV.open``), and the rests of their prompts go through the fused step: rests of
        up to ``_STEP_PREFILL`` tokens in a step over every slot that replays from a CUDA graph
        (``_prefill_in_step``), longer ones in chunks over the new rows (``_prefill_chunks``). A
        multi-turn episode's next turn is a short rest after a long cached prefix: through
        transformers' forward, 8 such rows launched 2,774 kernels on SmolLM2's shape, the prefixes
        rebuilt layer by layer as a left-padded cache; here 1,030, about a decode step's
        (tests/engines/test_static.py counts both; ``benchmarks/rollout.py --device cuda`` times them)."""
        kv, fused = self._kv, self._fused
        if fused is None:
            raise RuntimeError("the static path needs the fused decode step")
        self._slots.sync()
        first = kv.open(hits, (len(fused.layers), fused.kv_heads, fused.head_dim, self.model.dtype))
        rests = [list(s.request.prompt_ids[n:]) for s, (n, _) in zip(seqs, hits)]
        adapters = [s.adapter_key for s in seqs]
        if self.step_prefill and max(map(len, rests)) <= _STEP_PREFILL:
            logits = self._prefill_in_step(first, rests, [s.adapter_key for s in self._active] + adapters)
        else:
            logits = self._prefill_chunks(first, rests, adapters)
        self._active += seqs
        self._take(seqs, logits)
        self.stats.prefill_tokens += sum(map(len, rests))

    def _prefill_chunks(self, first: int, rests: list[list[int]], adapters: list[str]) -> torch.Tensor:
        """Rows ``first`` onward feed their ``rests``, all together, ``_PREFILL_CHUNK`` tokens a row
        per pass at most (shorter rests padded): the logits of each row's last token."""
        kv, fused, rows, pad = self._kv, self._fused, len(rests), self.tokenizer.pad_token_id or 0
        self._slots.route(adapters, rows)
        mode = self._slots.mode(adapters)
        picked: list[torch.Tensor | None] = [None] * rows  # each row's logits, from the pass with its last token
        try:
            for start in range(0, max(map(len, rests)), _PREFILL_CHUNK):
                parts = [r[start:start + _PREFILL_CHUNK] for r in rests]
                width = max(map(len, parts))
                kv.chunk, kv.step_first, kv.step_rows, kv.step_width = True, first, rows, width
                kv.reserve()  # before the window: it may grow the columns
                kv.window = window_bucket(max(kv.lengths[first:]) + width, kv.columns)
                ids = upload([p + [pad] * (width - len(p)) for p in parts], self.device)
                last = upload([i * width + max(len(p), 1) - 1 for i, p in enumerate(parts)], self.device)
                logits = fused(ids, kv, kv.positions(), NO_LORA if mode == "none" else self._slots, mode, last)
                for i, r in enumerate(rests):
                    if start < len(r) <= start + _PREFILL_CHUNK:
                        picked[i] = logits[i]
                kv.fed(first, [len(p) for p in parts])
                self.stats.prefill_passes += 1
        finally:
            kv.chunk = False
        return torch.stack(picked)

    def _prefill_in_step(self, first: int, rests: list[list[int]], adapters: list[str]) -> torch.Tensor:
        """Short rests as one chunk over every slot's bucket, like a decode step, so that it replays
        from a CUDA graph (per rows bucket, width bucket, window and adapter mode): rows ``first``
        onward feed their rests; the running rows and idle slots feed padding, whose keys land
        past their ends (a running row's next column is written again by its next step) and are
        never read. ``adapters``: every row's. The logits of each new row's last token."""
        kv, pad = self._kv, self.tokenizer.pad_token_id or 0
        width = max(8, 1 << (max(map(len, rests)) - 1).bit_length())
        bucket = rows_bucket(kv.rows, kv.slots)
        self._slots.route(adapters, bucket)
        mode = self._slots.mode(adapters)
        ids = torch.full((bucket, width), pad, dtype=torch.long)
        last = torch.arange(bucket) * width
        for i, rest in enumerate(rests):
            ids[first + i, :len(rest)] = torch.tensor(rest)
            last[first + i] += len(rest) - 1
        self._chunk_ids[:bucket, :width].copy_(upload(ids, self.device))
        self._chunk_last[:bucket].copy_(upload(last, self.device))
        kv.chunk, kv.step_width = True, width
        try:
            kv.reserve()  # before the window: it may grow the columns (never inside a capture)
            shape = (bucket, width, window_bucket(max(kv.lengths) + width, kv.columns), mode)
            logits = None
            if self.cuda_graphs and self._chunk_graphs is not None:
                try:
                    logits = self._chunk_graphs(shape, (kv.generation, self._slots.generation))
                except CaptureRefused as exc:  # the prefill still runs, eagerly from now on
                    log.warning("engine.prefill_graphs_off", error=" ".join(str(exc).split())[:300])
                    self._chunk_graphs = None
            if logits is None:
                logits = self._chunk_forward(*shape)
        finally:
            kv.chunk = False
        kv.fed(first, [len(r) for r in rests])
        self.stats.prefill_passes += 1
        return logits[first:first + len(rests)]

    def _chunk_forward(self, rows: int, width: int, window: int, lora: str) -> torch.Tensor:
        """A prefill chunk of ``width`` tokens over slots ``[0, rows)``, read from the chunk's
        buffers: what a CUDA graph of ``_prefill_in_step`` records."""
        kv = self._kv
        kv.chunk, kv.step_first, kv.step_rows, kv.step_width, kv.window = True, 0, rows, width, window
        return self._fused(self._chunk_ids[:rows, :width], kv, kv.positions(), NO_LORA if lora == "none" else self._slots,
                           lora, self._chunk_last[:rows])

    def _forward_rests(self, prompts: list, adapters: list[str], hits: list[tuple[int, Any]]):
        """One forward over each prompt's rest after its cached prefix, both parts left-padded:
        (output, mask over cached + rest columns, cached columns)."""
        self.stats.prefill_passes += 1
        cached = max(n for n, _ in hits)
        width = max(len(p) - n for p, (n, _) in zip(prompts, hits))
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(len(prompts), cached + width, dtype=torch.long)
        for i, (p, (n, _)) in enumerate(zip(prompts, hits)):
            rest = p[n:]
            ids[i, width - len(rest):] = torch.tensor(rest)
            mask[i, cached - n:cached] = 1
            mask[i, cached + width - len(rest):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)  # built on the host, moved in one copy each
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, cached:]
        return self._forward(ids, mask, self._past(hits, cached), adapters, positions, keep_last=True), mask, cached

    def _share_prefixes(self, seqs: list[_Seq]) -> None:
        """Newcomers that open the same way under the same adapter (a GRPO group's episodes, a
        seat's instructions) get their common prefixes computed once and put in the prefix cache,
        so each row looks them up instead of prefilling them again. Prefixes that extend none of
        the others go first, all adapters in one batch, then those that extend them, reusing them."""
        by_key: dict[tuple[str, int], list[list[int]]] = {}
        for s in seqs:
            by_key.setdefault(s.cache_key, []).append(list(s.request.prompt_ids))
        todo = [(key, tokens) for key, prompts in by_key.items() for tokens in shared_prefixes(prompts)]
        # what sharing saves: each row's longest shared opening, computed once instead of per row
        saved = sum(max((len(t) for k, t in todo if k == s.cache_key and list(s.request.prompt_ids[:len(t)]) == t),
                        default=0) for s in seqs) - sum(len(t) for _, t in todo)
        if saved <= self.pass_tokens:
            return
        while todo:
            level = [(k, t) for k, t in todo
                     if not any(k2 == k and len(t2) < len(t) and t[:len(t2)] == t2 for k2, t2 in todo)]
            todo = [x for x in todo if x not in level]
            rows = [(k, t, hit) for k, t in level
                    if len(t) - (hit := self._prefix.lookup(t + [-1], k))[0] >= BLOCK]  # -1: a stored copy of all of t counts
            for batch in length_batches([len(t) - hit[0] for _, t, hit in rows]):
                chosen = [rows[i] for i in batch]
                out, mask, cached = self._forward_rests([t for _, t, _ in chosen], [k[0] for k, _, _ in chosen],
                                                        [hit for _, _, hit in chosen])
                layers = getattr(out, self._cache_name).layers
                for i, (key, tokens, _) in enumerate(chosen):
                    cols = mask[i].nonzero().squeeze(-1)
                    self._prefix.insert(tokens, key, [layer.keys[i].index_select(1, cols) for layer in layers],
                                        [layer.values[i].index_select(1, cols) for layer in layers])
                self.stats.prefill_tokens += int(mask[:, cached:].sum())

    def _past(self, hits: list[tuple[int, Any]], cached: int) -> DynamicCache | None:
        """The rows' cached prefixes as one left-padded cache ``[rows, H, cached, D]`` per layer."""
        if cached == 0:
            return None
        like = next(e for n, e in hits if n)
        past = DynamicCache()
        for layer, k0 in enumerate(like.keys):
            k = k0.new_zeros(len(hits), k0.shape[0], cached, k0.shape[2])
            v = torch.zeros_like(k)
            for i, (n, entry) in enumerate(hits):
                if n:
                    k[i, :, cached - n:] = entry.keys[layer][:, :n]
                    v[i, :, cached - n:] = entry.values[layer][:, :n]
            past.update(k, v, layer)
        return past

    @cached_property
    def _fused(self) -> FusedDecoder | None:
        # built on first use, on the compute thread: packing weights is torch work (compute_thread.py)
        decoder = FusedDecoder.build(self.model, self.lora, rows_hint=self.max_batch, cpu=self._cpu)
        if decoder is None:
            log.info("engine.decode_path", path="transformers", model_type=self.model.config.model_type)
        else:
            log.info("engine.decode_path", path=f"fused:{decoder.layout}", why=decoder.layout_reason,
                     model_type=self.model.config.model_type, dtype=str(self.model.dtype))
        return decoder

    def _decode(self) -> None:
        t0, rows = time.perf_counter(), len(self._active)
        adapters = [s.adapter_key for s in self._active]
        ids = upload([s.tokens[-1] for s in self._active], self.device)
        fused = self._fused if self.fused_decode else None
        if fused is not None:
            with self._routed(adapters):
                logits = fused(ids, self._kv, self._kv.positions())
        else:
            mask = F.pad(self._kv.mask, (0, 1), value=1)
            logits = self._forward(ids[:, None], mask, self._kv.cache(), adapters, self._kv.positions()).logits[:, -1]
        self._kv.advance()
        self._take(self._active, logits)
        self.stats.decode_s += time.perf_counter() - t0
        self.stats.decode_steps += 1
        self.stats.decode_tokens += rows

    def _static_step(self, adapters: list[str], ids: torch.Tensor) -> torch.Tensor:
        """Logits of the running rows from a step over their bucket of slots (graphs.py)."""
        kv, rows = self._kv, len(adapters)
        kv.reserve()
        if self._fused is None:  # built first: it registers the LoRA groups the slots stack
            raise RuntimeError("the static path needs the fused decode step")
        self._slots.sync()
        bucket = rows_bucket(rows, kv.slots)
        window = window_bucket(max(kv.lengths) + 1, kv.columns)
        self._slots.route(adapters, bucket)
        self._ids[:rows] = ids  # rows past them keep stale ids: their slots are idle
        shape = (bucket, window, self._slots.mode(adapters))
        if self.cuda_graphs:  # read every step: a benchmark may switch it
            try:
                return self._graphs(shape, (kv.generation, self._slots.generation))[:rows]
            except CaptureRefused as exc:  # the step reruns (it writes only what its inputs determine), and
                # every step from now on runs eagerly; the graphs captured so far are let go
                log.warning("engine.decode_graphs_off", error=" ".join(str(exc).split())[:300])
                self.cuda_graphs = False
                self._graphs = StepGraphs(self._static_forward, self.device)
        return self._static_forward(*shape)[:rows]

    def _static_forward(self, rows: int, window: int, lora: str) -> torch.Tensor:
        """The static step over ``rows`` slots and ``window`` columns, adding LoRA as ``lora`` says
        (``SlotLoRA.mode``): what a CUDA graph records."""
        kv = self._kv
        kv.step_rows, kv.window = rows, window
        return self._fused(self._ids[:rows], kv, kv.positions(), NO_LORA if lora == "none" else self._slots, lora)

    def _take(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Sample each row's next token, append it (or its forced closing), retire the rows that are done."""
        self._apply(seqs, *(t.tolist() for t in self._sample(seqs, logits)))
        self._retire()

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each row's next token and its logprob, on the device (rows already done are sampled freely
        and ignored: the static path's step runs one step ahead of what the host has read); then,
        where a row asks for top_logprobs, the most likely tokens' ids and logprobs [B, k]."""
        sp = [s.request.sampling for s in seqs]
        t0 = time.perf_counter()
        bitmask, masked = self._grammar_masks(seqs)
        self.stats.grammar_s += time.perf_counter() - t0
        uniforms = counter_uniforms(torch.tensor([s.seed for s in seqs]), torch.tensor([s.draws for s in seqs]))
        temperatures = [p.temperature for p in sp]
        sampled = sample_on_device(logits, temperatures, [p.top_p for p in sp], uniforms, bitmask, masked)
        k = max(p.top_logprobs for p in sp)
        return sampled + top_logprobs(logits, temperatures, k, bitmask, masked) if k else sampled

    def _apply(self, seqs: list[_Seq], tokens: list[int], logprobs: list[float],
               top_ids: list[list[int]] | None = None, top_lps: list[list[float]] | None = None) -> None:
        """Append each running row's sampled token (or its forced closing); mark the rows that are done.
        A row whose booking raises fails its own request and leaves the batch."""
        for i, (seq, token, lp) in enumerate(zip(seqs, tokens, logprobs)):
            if seq.done is not None or seq.cancelled:
                continue
            try:
                self._book(seq, token, lp, list(zip(top_ids[i], top_lps[i])) if top_ids else [])
            except Exception as exc:  # one row's fault (its grammar refused the token, say) fails it alone
                log.error("engine.request_failed", error=f"{type(exc).__name__}: {exc}")
                seq.cancelled = True  # leaves the batch at the next _retire
                self._fail(seq, exc)

    def _book(self, seq: _Seq, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        seq.draws += 1
        if seq.grammar is not None and seq.grammar.forced:
            self._force_closing(seq)
        else:
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            if k := seq.request.sampling.top_logprobs:  # the batch's k may be larger; banned tokens left out
                seq.top.append([(t, lp) for t, lp in top[:k] if lp > -math.inf])
            if seq.grammar is not None:
                seq.grammar.accept(token)
        self._check_done(seq)
        if seq.done is not None and seq.grammar is not None:
            seq.done.forced_tokens = seq.grammar.forced_count

    def _retire(self) -> None:
        """Take the rows that are done or cancelled out of the batch, then resolve the done ones."""
        if any(s.done or s.cancelled for s in self._active):
            keep = [i for i, s in enumerate(self._active) if not (s.done or s.cancelled)]
            finished = [s for s in self._active if s.done]
            if self._prefix is not None:
                for i, s in enumerate(self._active):
                    if s.done and not s.done.forced_tokens:  # forced closings: tokens and KV part ways
                        self._remember(i, s)
            order = self._kv.compaction(keep)  # the static path fills holes from the end
            self._active = [self._active[i] for i in order]
            self._kv.keep(order)
            # Resolve only after the rows left the batch, so a caller woken by its result sees `busy` without them.
            for s in finished:
                _deliver(s, _resolve, s.done)

    def _remember(self, row: int, seq: _Seq) -> None:
        """Put a finished row's keys and values in the prefix cache, with the tokens they encode;
        not a row whose adapter changed while it ran (its keys mix two sets of weights)."""
        key, version = seq.cache_key
        if key != BASE and self.versions.get(key) != version:
            return
        count = self._kv.length(row)  # fed tokens (the CPU path never feeds the last sampled one)
        keys, values = self._kv.row(row)
        self._prefix.insert((list(seq.request.prompt_ids) + seq.tokens)[:count], seq.cache_key, keys, values)

    # -- constrained decoding (orchestrator/grammar/) ----------------------------------------------
    @cached_property
    def _grammars(self) -> GrammarBook:
        return book_for(self.tokenizer, self.model.get_output_embeddings().weight.shape[0])

    def _constrained_row(self, request: GenerationRequest) -> ConstrainedRow:
        matcher = self._grammars.matcher(request.json_schema, request.reply_prefix)
        return ConstrainedRow(self._grammars, matcher, request.sampling.max_tokens,
                              spellings=self._grammars.spellings(request.json_schema, request.reply_prefix))

    def _grammar_masks(self, seqs: list[_Seq]) -> tuple[torch.Tensor | None, list[int]]:
        """Plan each constrained row's step; fill the masks of the rows that sample, in one call."""
        rows = []
        for i, s in enumerate(seqs):
            if s.grammar is not None and s.done is None and not s.cancelled:
                s.grammar.plan(len(s.tokens))
                if not s.grammar.forced:
                    rows.append(i)
        if not rows:
            return None, []
        bitmask = self._grammars.new_bitmask(len(seqs))
        self._grammars.fill([seqs[i].grammar.matcher for i in rows], bitmask, rows)
        for i in rows:
            seqs[i].grammar.restrict(bitmask[i])
        return bitmask, rows

    def _force_closing(self, seq: _Seq) -> None:
        """Close a constrained reply the length budget is running out on (not sampled: logprob 0)."""
        drop, tokens = seq.grammar.take_forced()
        if drop:
            del seq.tokens[-drop:], seq.logprobs[-drop:], seq.top[-drop:]
        seq.tokens += tokens
        seq.logprobs += [0.0] * len(tokens)
        if seq.request.sampling.top_logprobs:
            seq.top += [[] for _ in tokens]

    def _check_done(self, seq: _Seq) -> None:
        sp = seq.request.sampling
        token = seq.tokens[-1]
        eos = token in self.eos_ids and not sp.ignore_eos
        reason = "eos" if eos else "length" if len(seq.tokens) >= sp.max_tokens else None
        if reason is None and not (sp.stop and self._stop_in_tail(seq.tokens, sp.stop)):
            return  # the whole text is only needed once the reply is done
        text = self._reply_text(seq.tokens)
        if (cut := cut_at_stop(text, sp.stop)) is not None:
            text, reason = cut, "stop"
        if reason:
            seq.done = Completion(
                token_ids=list(seq.tokens), text=text, logprobs=list(seq.logprobs), finish_reason=reason,
                adapter=seq.request.adapter, adapter_version=seq.adapter_version,
                spelled=seq.grammar is not None and seq.grammar.spellings is not None,  # a cut, not just a grammar
                top_logprobs=list(seq.top) if sp.top_logprobs else None,
            )

    def _stop_in_tail(self, tokens: list[int], stop: tuple[str, ...]) -> bool:
        """Whether a stop string may end in the last token: one of S characters spans at most 4*S
        tokens (each a byte at least), so the tail that long holds it. Decoding the whole reply
        cost O(length) a row per step: 0.19 ms at 1,024 tokens, 48 ms a step over a batch of 256,
        where an H100 decodes one in 11 ms. A find there is checked on the whole text."""
        tail = tokens[-(4 * max(map(len, stop)) + 2):]
        return cut_at_stop(self._reply_text(tail), stop) is not None

    def _reply_text(self, tokens: list[int]) -> str:
        return self.decode([t for t in tokens if t not in self.eos_ids])

    def _fail(self, seq: _Seq, exc: BaseException) -> None:
        _deliver(seq, _reject, exc)


def _deliver(seq: _Seq, settle: Any, value: Any) -> None:
    """Settle ``seq``'s future on its event loop. A loop closed meanwhile (its ``asyncio.run``
    returned: nobody awaits the request) is skipped: raising here would end the compute thread,
    and with it every engine and trainer of the process."""
    try:
        seq.loop.call_soon_threadsafe(settle, seq.future, value)
    except RuntimeError:  # "Event loop is closed"
        pass


def _resolve(future: asyncio.Future, value: Completion) -> None:
    if not future.done():
        future.set_result(value)


def _reject(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
