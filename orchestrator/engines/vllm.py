"""The GPU backend: vLLM serving many role adapters on one base model (multi-LoRA).

Install with ``pip install 'rolecast[vllm]'`` on a CUDA machine. ``vllm`` is imported when an
engine is built, never when this module is, so rolecast installs and tests without it.

Targets vLLM's V1 engine (``AsyncLLM``, exported as ``vllm.AsyncLLMEngine``), vLLM >= 0.10.2:
``SamplingParams.structured_outputs`` (``StructuredOutputsParams``) appeared there, replacing the
``guided_decoding`` fields removed in 0.12, and ``logprobs_mode="processed_logprobs"`` already
meant the final (post top-p) logprobs (vllm#22387).

**Adapters.** Every adapter version is its own ``LoRARequest(f"{name}@v{version}", fresh int id,
snapshot dir)``:

- vLLM loads a LoRA from its path the first time a request names its int id, and caches it by id.
  The trainer rewrites ``sampler/<adapter>`` in place after each step, so each version is copied
  into a snapshot dir this engine owns: a request in flight, or a reload after vLLM evicted the
  slot, always reads the weights it was sampled with.
- The prefix cache keys KV blocks by the LoRA's int id (vLLM < 0.11.1) or by its name (later:
  vllm#27211), so reusing either after a reload would serve KV computed with the old weights
  (vllm#30931, vllm#42125). Both change with every version.
- A superseded version is removed from vLLM (``remove_lora``) and its snapshot deleted once no
  request in flight uses it.

**Structured outputs.** A constrained request goes to vLLM as an EBNF grammar
(``StructuredOutputsParams(grammar=...)``, xgrammar's dialect: vLLM's default backend): the HF
engine's own grammar of the schema, tight JSON, after the role's reply prefix
(``grammar.grammar_after``). The prefix is already in the prompt, so a grammar of the whole
message would make the model start a second object after it. A grammar is over text, so vLLM
samples every token spelling of a small language's texts where the HF engine keeps the
tokenizer's own (``grammar/spelling.py``); completions say ``spelled=False`` and training
replays their masks uncut.

**Logprobs.** The engine runs with ``logprobs_mode="processed_logprobs"`` and each request asks for
``logprobs=0`` (its ``top_logprobs``, where it asks for alternatives): the sampled token's logprob
under the distribution it was drawn from, i.e. log softmax(logits / T) after top-p truncation,
renormalised over the nucleus (vLLM's default, ``raw_logprobs``, is before temperature). With
``top_p == 1`` (rolecast's default) that is exactly
the ``Completion`` contract; with ``top_p < 1`` it is higher by -log(nucleus mass) than the
teacher-forced value the trainer computes. Under a JSON schema the grammar mask is applied before
the sampler, so the logprob is that of the renormalised masked distribution.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import shutil
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Coroutine

import structlog

from sandboxes.pool import scratch_root

from ..files import writing
from .base import AdapterVersions, Completion, FinishReason, GenerationRequest, RequestRefused, cut_at_stop
from ..grammar.schema import grammar_after
from .tokens import TokenizerMethods, end_of_turn_ids

log = structlog.get_logger()
INSTALL_HINT = "pip install 'rolecast[vllm]' (needs a CUDA GPU)"
MIN_VERSION = "0.10.2"
# vLLM samples a temperature in (0, 0.01) at 0.01 (SamplingParams' _MAX_TEMP, with a warning in its log)
MIN_TEMPERATURE = 0.01


# The max_lora_rank values vLLM accepts; its adapter slots are preallocated at that rank, so the
# engine takes the smallest one that holds the run's adapters (and 64 at least, for --adapter dirs).
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank_for(rank: int) -> int:
    """The max_lora_rank an engine serving LoRA adapters of rank up to ``rank`` is started with."""
    fits = [r for r in LORA_RANKS if r >= max(rank, 64)]
    if not fits:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank, {LORA_RANKS[-1]}")
    return fits[0]


class VLLMUnavailable(ImportError):
    """vllm is not installed, or too old for this backend."""


def import_vllm() -> SimpleNamespace:
    """The vLLM names this backend uses, or a VLLMUnavailable that says how to get them."""
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailable(f"the vllm engine needs the vllm package ({exc}): {INSTALL_HINT}") from None
    try:
        from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
    except ImportError as exc:
        version = getattr(vllm, "__version__", "?")
        raise VLLMUnavailable(f"vllm {version} is too old for rolecast ({exc}): needs vllm>={MIN_VERSION}") from None
    return SimpleNamespace(
        AsyncEngineArgs=AsyncEngineArgs, AsyncLLMEngine=AsyncLLMEngine, SamplingParams=SamplingParams,
        TokensPrompt=TokensPrompt, LoRARequest=LoRARequest, RequestOutputKind=RequestOutputKind,
        StructuredOutputsParams=StructuredOutputsParams,
    )


@dataclass(eq=False)
class _Version:
    """One published version of an adapter; ``lora`` None = no weights yet (samples the base model)."""

    name: str
    version: int
    lora: Any = None  # vllm LoRARequest
    snapshot: Path | None = None
    inflight: int = 0
    retired: bool = False


class VLLMEngine(TokenizerMethods, AdapterVersions):
    """The Engine protocol over ``vllm.AsyncLLMEngine``, with HFEngine's adapter API."""

    def __init__(
        self, model: str | Path, *, tokenizer: Any = None, dtype: str = "auto", seed: int = 0,
        max_loras: int = 8, max_lora_rank: int = 64, gpu_memory_utilization: float = 0.85,
        engine_args: dict[str, Any] | None = None,
    ):
        self._v = import_vllm()
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
        self.tokenizer = tokenizer
        self.model = str(model)
        self.eos_ids = end_of_turn_ids(tokenizer)
        self.max_lora_rank = max_lora_rank
        args = self._v.AsyncEngineArgs(
            model=self.model, dtype=dtype, seed=seed, enable_lora=True, max_loras=max_loras,
            max_lora_rank=max_lora_rank, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
            gpu_memory_utilization=gpu_memory_utilization, **(engine_args or {}),
        )
        self._llm = self._v.AsyncLLMEngine.from_engine_args(args)
        AdapterVersions.__init__(self)
        self._current: dict[str, _Version] = {}
        self._lock = threading.Lock()  # adapters change from the trainer's thread while requests run
        self._lora_ids = itertools.count(1)  # vLLM wants ids > 0, unique for the engine's lifetime
        self._request_ids = itertools.count()
        # in the process's scratch: removed with it where the process dies before aclose
        self._snapshots = Path(tempfile.mkdtemp(prefix="vllm-", dir=scratch_root()))
        self._loop: asyncio.AbstractEventLoop | None = None  # vLLM's; set by the first generate
        self._pending: set[Future] = set()
        self._inflight = 0
        self._closed = False
        self._warned: set[tuple[str, str | None]] = set()  # logged once each

    # -- the Engine interface ------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> Completion:
        if self._closed:
            raise RuntimeError("the engine is closed")
        self._loop = asyncio.get_running_loop()
        params = self.sampling_params(request)
        with self._lock:
            version = self._acquire(request.adapter)
        request_id = f"rolecast-{next(self._request_ids)}"
        prompt = self._v.TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        stream = self._llm.generate(prompt, params, request_id, lora_request=version.lora if version else None)
        final = None
        try:
            async for output in stream:
                final = output
        except ValueError as exc:  # vLLM's checks of the request as it is added (a prompt past its context)
            raise RequestRefused(str(exc)) from None
        except asyncio.CancelledError:
            # A cancelled caller (or an asyncio.wait_for timeout) must not leave the sequence running.
            try:
                await self._llm.abort(request_id)
                await stream.aclose()
            except Exception as exc:
                log.warning("vllm.abort_failed", request=request_id, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            with self._lock:
                self._release(version)
        if final is None or not final.outputs:
            raise RuntimeError(f"vllm returned no output for request {request_id}")
        return self._completion(request, final.outputs[0], version)

    async def aclose(self) -> None:
        self._closed = True
        for fut in list(self._pending):
            await asyncio.wrap_future(fut)
        shutdown = getattr(self._llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
        shutil.rmtree(self._snapshots, ignore_errors=True)

    @property
    def busy(self) -> int:
        """Requests submitted and not yet returned."""
        return self._inflight

    # -- request mapping -----------------------------------------------------------------------
    def sampling_params(self, request: GenerationRequest) -> Any:
        """vLLM SamplingParams for a rolecast request (one sample, final output only)."""
        s = request.sampling
        if 0 < s.temperature < MIN_TEMPERATURE:  # its tokens and logprobs would be another temperature's
            raise RequestRefused(f"the vllm engine samples at temperature 0 (greedy) or at least {MIN_TEMPERATURE}, "
                             f"got {s.temperature}: vLLM would sample at {MIN_TEMPERATURE}")
        if s.top_p < 1.0 and s.temperature > 0 and ("top_p", None) not in self._warned:
            self._warned.add(("top_p", None))
            log.warning("vllm.logprobs_after_top_p", top_p=s.top_p,
                        note="recorded logprobs are renormalised over the top-p nucleus (see docs/engine.md)")
        kwargs: dict[str, Any] = dict(
            n=1, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed,
            stop=[x for x in s.stop if x] or None,
            stop_token_ids=None if s.ignore_eos else sorted(self.eos_ids),  # end of turn, like the HF engine
            ignore_eos=s.ignore_eos,
            logprobs=s.top_logprobs,  # the sampled token's own logprob, and the N most likely where asked
            skip_special_tokens=True, output_kind=self._v.RequestOutputKind.FINAL_ONLY,
        )
        if request.json_schema:
            # The HF engine's grammar (tight JSON: ", " and ": ", no free whitespace) of what follows
            # the reply prefix, which sits in the prompt: vLLM's grammar starts where sampling does.
            grammar = grammar_after(request.json_schema, request.reply_prefix)
            kwargs["structured_outputs"] = self._v.StructuredOutputsParams(grammar=grammar)
        return self._v.SamplingParams(**kwargs)

    def _completion(self, request: GenerationRequest, out: Any, version: _Version | None) -> Completion:
        token_ids = list(out.token_ids)
        text, k = out.text, request.sampling.top_logprobs
        if isinstance(out.stop_reason, str):  # vLLM cuts at the first stop string listed that it finds, not the earliest
            cut = cut_at_stop(self.decode(token_ids), request.sampling.stop)
            text = text if cut is None else cut
        return Completion(
            token_ids=token_ids, text=text, logprobs=sampled_logprobs(out.logprobs, token_ids),
            finish_reason=finish_reason(out.finish_reason, out.stop_reason),
            adapter=request.adapter, adapter_version=version.version if version else 0,
            top_logprobs=[most_likely(step, k) for step in out.logprobs] if k else None,
        )

    # -- adapters ------------------------------------------------------------------------------
    def adapter_version(self, name: str) -> int:
        return self.versions.get(name, 0)

    def add_adapter(self, name: str) -> int:
        """A fresh adapter (B = 0): it samples exactly like the base model until weights arrive."""
        with self._lock:
            return self._install(_Version(name, self.next_version(name)))

    def load_adapter(self, name: str, path: str | Path) -> int:
        """PEFT-format weights from ``path`` (copied, so later writes there do not leak in)."""
        source = Path(path)
        weights = ("adapter_model.safetensors", "adapter_model.bin")
        if not (source / "adapter_config.json").is_file() or not any((source / w).is_file() for w in weights):
            raise FileNotFoundError(f"{source}: not a PEFT adapter dir (needs adapter_config.json and {weights[0]})")
        # else vLLM finds it only when a request first loads the LoRA, as an error in its engine core
        rank = json.loads((source / "adapter_config.json").read_text()).get("r", 0)
        if rank > self.max_lora_rank:
            raise ValueError(f"{source}: LoRA rank {rank} is above the vllm engine's max_lora_rank {self.max_lora_rank}")
        # not named after the adapter: serve's --adapter ../../x=DIR put its copy outside the snapshots dir
        snapshot = Path(tempfile.mkdtemp(prefix="adapter-", dir=self._snapshots))
        shutil.copytree(source, snapshot, dirs_exist_ok=True)
        with self._lock:
            version = self.next_version(name)
            lora = self._v.LoRARequest(f"{name}@v{version}", next(self._lora_ids), str(snapshot))
            return self._install(_Version(name, version, lora, snapshot))

    def update_adapter(self, name: str, state_dict: dict[str, Any], scale: float = 1.0) -> int:
        """Replace an adapter's weights (PEFT key format; B is multiplied by ``scale`` = alpha / r)."""
        if name not in self.versions:
            raise KeyError(f"no adapter {name!r} to update (add or load it first)")
        with tempfile.TemporaryDirectory(dir=self._snapshots) as tmp:
            write_peft_adapter(Path(tmp), state_dict, scale, base_model=self.model)
            return self.load_adapter(name, tmp)

    def remove_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._current:
                raise KeyError(f"no adapter {name!r}")
            self._retire(self._current.pop(name))
            self.forget_version(name)

    # -- version bookkeeping (under self._lock) -------------------------------------------------
    def _install(self, new: _Version) -> int:
        old = self._current.get(new.name)
        self._current[new.name] = new
        self.versions[new.name] = new.version
        if old is not None:
            self._retire(old)
        return new.version

    def _acquire(self, name: str | None) -> _Version | None:
        self._inflight += 1
        if name is None:
            return None
        current = self._current.get(name)
        if current is None:
            if ("adapter", name) not in self._warned:
                self._warned.add(("adapter", name))
                log.info("engine.adapter_not_loaded", adapter=name, note="sampling from the base model (version 0)")
            return None
        current.inflight += 1
        return current

    def _release(self, version: _Version | None) -> None:
        self._inflight -= 1
        if version is None:
            return
        version.inflight -= 1
        if version.retired and version.inflight == 0:
            self._evict(version)

    def _retire(self, version: _Version) -> None:
        version.retired = True
        if version.inflight == 0:
            self._evict(version)

    def _evict(self, version: _Version) -> None:
        if version.lora is None:
            return
        if self._loop is None or self._loop.is_closed():  # vLLM never ran a request, or is gone
            shutil.rmtree(version.snapshot, ignore_errors=True)
            return
        self._spawn(self._remove_lora(version))

    async def _remove_lora(self, version: _Version) -> None:
        # The snapshot goes only after vLLM acknowledged the removal: an abort sent just before may
        # still be queued in the engine core, whose step would then load the LoRA from this dir.
        try:
            await self._llm.remove_lora(version.lora.lora_int_id)
        except Exception as exc:  # a failed eviction wastes a cache slot; it must not fail a request
            log.warning("vllm.remove_lora_failed", lora=version.lora.lora_name, error=f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(version.snapshot, ignore_errors=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on vLLM's event loop, from that loop or from another thread (the trainer's)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)


def finish_reason(reason: str | None, stop_reason: int | str | None) -> FinishReason:
    """vLLM's (finish_reason, stop_reason) in rolecast's terms.

    vLLM says ``stop`` for both a stop string (``stop_reason`` is the string) and an end token
    (``stop_reason`` is None for the model's EOS, the token id for ``stop_token_ids``).
    """
    if reason == "stop":
        return "stop" if isinstance(stop_reason, str) else "eos"
    if reason == "length":
        return "length"
    if reason == "abort":
        return "cancelled"
    return "error"


def sampled_logprobs(steps: list[dict[int, Any]] | None, token_ids: list[int]) -> list[float]:
    """The sampled tokens' logprobs from vLLM's per-step {token id: Logprob} dicts."""
    if steps is None:
        raise RuntimeError("vllm returned no logprobs (SamplingParams.logprobs must be set)")
    if len(steps) != len(token_ids):
        raise RuntimeError(f"vllm returned {len(steps)} logprob steps for {len(token_ids)} tokens")
    try:
        return [float(step[token].logprob) for step, token in zip(steps, token_ids)]
    except KeyError as exc:
        raise RuntimeError(f"vllm logprobs lack the sampled token {exc}") from None


def most_likely(step: dict[int, Any], k: int) -> list[tuple[int, float]]:
    """The (token id, logprob) pairs of vLLM's ranks 1 to ``k`` in one step's dict, most likely first
    (the sampled token is in the dict whatever its rank; tokens a grammar bans have -inf)."""
    ranked = sorted((lp.rank, token, float(lp.logprob)) for token, lp in step.items()
                    if lp.rank is not None and lp.rank <= k and lp.logprob > -math.inf)
    return [(token, logprob) for _, token, logprob in ranked]


def write_peft_adapter(folder: Path, state_dict: dict[str, Any], scale: float, base_model: str = "") -> None:
    """A PEFT-format LoRA dir from a state dict (``...<module>.lora_A.weight`` keys), alpha = scale * r."""
    from safetensors.torch import save

    ranks = {v.shape[0] for k, v in state_dict.items() if k.endswith("lora_A.weight")}
    if len(ranks) != 1:
        raise ValueError(f"expected lora_A weights of one rank, found ranks {sorted(ranks) or 'none'}")
    rank = ranks.pop()
    modules = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in state_dict if ".lora_" in k})
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / "adapter_model.safetensors"
    with writing(weights):  # save_file's full disk was a SafetensorError naming no file
        weights.write_bytes(save({k: v.detach().contiguous() for k, v in state_dict.items()}))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": scale * rank,
              "target_modules": modules, "lora_dropout": 0.0, "bias": "none", "base_model_name_or_path": base_model}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
