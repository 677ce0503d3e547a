"""A local training service shaped like Tinker's: one base model, one LoRA adapter per client.

    service = ServiceClient("smollm2-135m")
    pro = service.create_lora_training_client("pro", LoraConfig(rank=16))
    fut = await pro.forward_backward_async(data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    await (await pro.optim_step_async(AdamParams(learning_rate=1e-4))).result_async()
    pro.save_weights_for_sampler("pro")     # the attached engine now samples the new weights

    service.forward_backward_many([(pro, pro_data, "ppo", {}), (con, con_data, "ppo", {})])  # one pass for both

All model work runs as jobs on the process's compute thread (``compute_thread.py``, shared with the
engine's scheduler), in submission order, so adapters never race for the shared base model.
PEFT holds the adapters' weights and writes their files, but its layers stay switched off: the
passes add each row's adapter delta themselves (``routing.py``), so rows of several adapters
share a pass and gradients reach only the adapters in it. Each adapter has its own optimizer
over its own parameters.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import shutil
import tempfile
import warnings
import zlib
from dataclasses import asdict
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable, Generic, TypeVar

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model, set_peft_model_state_dict
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file, save

from ..compute_thread import compute_thread
from ..engines.lora import lora_scale
from ..config import LOSS_CONFIGS
from ..errors import RolecastError
from ..grammar.book import book_for
from ..models import LoadedModel, bf16_native, load_model
from ..upload import Download, move_together, upload
from .losses import LOSS_FNS, aggregate, k3_kl, token_logprobs
from ..files import fsync_dir, read_saved, save_torch, write_atomic
from . import prefix_tree
from .routing import lora_layers, routed
from .rng import load_rng, save_rng
from .types import MEAN_NAMED, AdamParams, Datum, ForwardBackwardOutput, LoraConfig, OptimStepResponse

T = TypeVar("T")


class APIFuture(Generic[T]):
    """The result of a submitted call: ``result()`` blocks, ``await result_async()`` does not."""

    def __init__(self, future: concurrent.futures.Future):
        self._future = future

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    async def result_async(self, timeout: float | None = None) -> T:
        # shielded: a timeout (or a cancelled waiter) cancelled the call itself where it was still
        # queued, so an optimizer step or a forward_backward silently never ran; as with result()
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._future)), timeout)

    def done(self) -> bool:
        return self._future.done()


def logprob_chunk(device: torch.device) -> int:
    """Positions per block of LM-head logits in the client's passes (``losses.token_logprobs``)."""
    return 4096 if device.type == "cuda" else 512


def unmatched_targets(model: torch.nn.Module, targets: Sequence[str]) -> list[str]:
    """The ``target_modules`` entries that match no linear layer of ``model``, as PEFT matches them
    (the whole name, or its last dotted parts): none at all, or also another module (``mlp``, a
    norm), which PEFT refuses with a traceback that prints the module."""
    modules = list(model.named_modules())

    def linears_only(target: str) -> bool:
        matched = [m for n, m in modules if n == target or n.endswith("." + target)]
        return bool(matched) and all(isinstance(m, (torch.nn.Linear, BaseTunerLayer)) for m in matched)  # or one PEFT wrapped

    return [t for t in targets if not linears_only(t)]


def linear_names(model: torch.nn.Module) -> list[str]:
    """The last names of ``model``'s inner linear layers (q_proj, ...), in order: what a LoRA may target."""
    found = (name.removesuffix(".base_layer").rsplit(".", 1)[-1] for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and ".lora_" not in name)  # not another adapter's own layers
    return list(dict.fromkeys(n for n in found if n != "lm_head"))


class ServiceClient:
    """Owns the base model (fp32 master weights) on ``device``; all adapters' jobs run on the
    compute thread.

    ``shared``: ``model`` is an engine's ``LoadedModel``, trained as it is: one copy of the base
    weights on the device, frozen, in the engine's dtype (bf16 on a GPU: under bf16 autocast the
    matmuls see the same numbers as from fp32 masters), with LoRA weights and optimizer state in
    fp32. PEFT's layers stay off, so the engine's own forward passes over the same modules see
    the base model (plus its own adapters' deltas).
    """

    def __init__(
        self, model: str | LoadedModel = "smollm2-135m", *, bf16_autocast: bool | None = None, seed: int = 0,
        micro_batch_tokens: int | None = None, device: str | torch.device = "cpu", shared: bool = False,
        share_prefixes: bool = True, joint_passes: bool | None = None, pass_tokens: int | None = None,
    ):
        if shared and not isinstance(model, LoadedModel):
            raise ValueError("a shared ServiceClient trains an engine's loaded model: pass engine.loaded")
        # 0 had meant the default, unsaid, and a negative budget a pass per datum
        if micro_batch_tokens is not None and (isinstance(micro_batch_tokens, bool) or micro_batch_tokens < 1):
            raise ValueError(f"micro_batch_tokens: {micro_batch_tokens!r}; a number of tokens, 1 or more (None: the default)")
        if pass_tokens is not None and (isinstance(pass_tokens, bool) or pass_tokens < 0):
            raise ValueError(f"pass_tokens: {pass_tokens!r}; a number of tokens, 0 or more (None: the default)")
        self.shared = shared
        self.device = torch.device(device)
        self.seed = seed
        # Cost budget per forward/backward pass (see _micro_batches). A GPU runs 16 passes of 4
        # rows at a fraction of one pass of 64 (measured on the H100: 8.7k tok/s for 64 x 512
        # tokens in passes of 4, a plain PEFT loop 101.5k in one), and its SDPA keeps no L^2
        # attention for backward; the LM head's chunks grow with it.
        gpu = self.device.type == "cuda"
        self.micro_batch_tokens = micro_batch_tokens or (131072 if gpu else 4096)
        self.logprob_chunk = logprob_chunk(self.device)
        self.share_prefixes = share_prefixes  # passes compute each shared prefix once (prefix_tree.py)
        # What a pass costs besides its tokens, in tokens: the prefix tree recomputes a shared
        # segment in each branch rather than give it a pass below this. About 30 on a 2-core CPU. On a
        # GPU a small model's pass is bound by its kernel launches: on the H100 a pass of 2,048 tokens
        # took 0.24 s where its tokens alone cost 0.02 s (a plain 64 x 512 pass's rate), so thousands.
        self.pass_tokens = (4096 if gpu else prefix_tree.RECOMPUTE_TOKENS) if pass_tokens is None else pass_tokens
        # forward_backward_many: several adapters' datums in one pass (_micro_batches). Fewer, larger
        # passes: on the CPU, where a pass is compute-bound, that lost as often as it won
        # (docs/training.md); on a GPU it saves whole passes' launches. On there by default.
        self.joint_passes = gpu if joint_passes is None else joint_passes
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, dtype="float32", seed=seed)
        if not shared:  # master weights in fp32 on the device; autocast runs the matmuls in bf16
            self.loaded.model.to(self.device, torch.float32)
        self.autocast = bf16_native(self.device) if bf16_autocast is None else bf16_autocast
        self.peft = None  # created with the first adapter
        self._lora_layers: list = []  # the PEFT model's LoRA layers, found when an adapter is added
        self.clients: dict[str, TrainingClient] = {}
        self.engine = None
        self._compute = compute_thread()

    @classmethod
    def for_engine(cls, engine: Any, model: str, **options: Any) -> "ServiceClient":
        """The service ``rolecast train`` uses beside ``engine``: sharing its base weights where it
        is the HF engine on a GPU (one copy in GPU memory), else a model of its own."""
        from ..engines.hf import HFEngine

        if isinstance(engine, HFEngine) and engine.device.type == "cuda":
            return cls(engine.loaded, shared=True, **{**options, "device": engine.device})
        return cls(model, **options)

    def attach_engine(self, engine: Any) -> None:
        """After ``save_weights_for_sampler`` the engine samples from the new adapter weights."""
        self.engine = engine

    def create_lora_training_client(self, name: str, lora: LoraConfig | None = None) -> "TrainingClient":
        if name in self.clients:
            raise ValueError(f"adapter {name!r} already has a training client")
        lora = lora or LoraConfig()
        if missing := unmatched_targets(self.loaded.model, lora.target_modules):  # PEFT wraps the others, silently
            raise RolecastError(f"lora.target_modules: {', '.join(missing)} names no linear layer of {self.loaded.name} "
                                f"(its linear layers: {', '.join(linear_names(self.loaded.model))})")
        peft_config = PeftLoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():  # PEFT reads a transformers attribute deprecated in v5
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            if self.peft is None:
                self.peft = get_peft_model(self.loaded.model, peft_config, adapter_name=name)
            else:
                self.peft.add_adapter(name, peft_config)
            self.peft.base_model.disable_adapter_layers()  # the passes add the deltas (routing.py)
        self._lora_layers = lora_layers(self.peft)  # a new adapter may wrap modules the others left alone
        client = TrainingClient(self, name, lora)
        self._seed_init(client)
        self.clients[name] = client
        return client

    def _seed_init(self, client: "TrainingClient") -> None:
        """Draw the adapter's LoRA A from the service's seed and the adapter's name (B stays 0),
        so a run is reproducible from its seed and an adapter's start does not depend on which
        adapters were created before it."""
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{client.name}".encode()))
        with torch.no_grad():
            for p in client.lora_params("lora_A"):
                bound = 1 / math.sqrt(p.shape[1])  # PEFT's default: kaiming-uniform(a=sqrt(5)) on A
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=generator))

    def submit(self, fn: Callable[..., T], *args: Any) -> APIFuture[T]:
        return APIFuture(self._compute.submit(fn, *args))

    def forward_backward_many(
        self, calls: list[tuple["TrainingClient", list[Datum], str, dict[str, Any] | None]],
    ) -> APIFuture[list[ForwardBackwardOutput]]:
        """Several ``forward_backward`` calls, of one adapter or several, in one job. With
        ``joint_passes``, micro-batches hold datums of several adapters and one forward/backward
        pass computes them all, each row through its own adapter; without, each adapter's datums
        have passes of their own. Each call gets the outputs and gradients it would get alone (up
        to summation order)."""
        return self.submit(self._passes, [(c, d, f, dict(o or {})) for c, d, f, o in calls], True)

    async def forward_backward_many_async(self, calls) -> APIFuture[list[ForwardBackwardOutput]]:
        return self.forward_backward_many(calls)

    def _passes(self, calls: list[tuple["TrainingClient", list[Datum], str, dict[str, Any]]], backward: bool) -> list[ForwardBackwardOutput]:
        """The calls' losses over micro-batches of all their datums; gradients accumulated into
        each call's adapter when ``backward``."""
        jobs = [_Job(*call) for call in calls]
        items = [(k, i) for k, job in enumerate(jobs) for i in range(len(job.data))]  # (job, datum)
        for rows in self._micro_batches([jobs[k].data[i].model_input.tokens for k, i in items],
                                        [jobs[k].adapter for k, i in items]):
            with torch.set_grad_enabled(backward):
                loss = self._micro_batch(jobs, [items[r] for r in rows])
                if backward:
                    loss.backward()
        return [job.output() for job in jobs]

    def _micro_batch(self, jobs: list["_Job"], part: list[tuple[int, int]]) -> torch.Tensor:
        """The summed loss of one micro-batch's datums (``part``: (job, datum) pairs), each job's
        share reduced over that job's whole batch, its per-token metrics added into the job."""
        device = self.device
        datums = [jobs[k].data[i] for k, i in part]
        adapters = [jobs[k].adapter for k, _ in part]
        hidden = self._hidden(datums, adapters)
        base = None
        if any(jobs[k].options.kl_coef for k, _ in part):
            with torch.no_grad():
                base = self._hidden(datums, None)
        starts = [0]
        for d in datums:
            starts.append(starts[-1] + d.model_input.length)
        total = hidden.new_zeros(())
        for k in dict.fromkeys(k for k, _ in part):
            job, mine = jobs[k], [r for r, (j, _) in enumerate(part) if j == k]
            data = [datums[r] for r in mine]
            # Indices are worked out on the host and every tensor goes up with `upload`: a boolean
            # index or a pageable copy here would make the host wait for the pass's forward.
            indices = [part[r][1] for r in mine]
            masks = [job.masks[i] for i in indices]
            host_mask = torch.cat(masks)
            keep = host_mask > 0  # action tokens: the only positions that go through the LM head
            at = torch.cat([torch.arange(starts[r], starts[r + 1]) for r in mine])[keep]
            rows, kept = upload(at, device), upload(keep.nonzero().flatten(), device)
            targets = upload(torch.cat([job.inputs["target_tokens"][i] for i in indices])[keep], device)
            mask = upload(host_mask, device)
            inputs = {key: upload(torch.cat([job.inputs[key][i] for i in indices]), device) for key in job.needed}
            bitmask = self._grammar_masks(data, masks)
            options = job.options

            def pick(states: torch.Tensor, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
                out = self._pick(states.index_select(0, rows), targets, options.temperature, bitmask, entropy)
                # every position of the share, 0.0 where no action was taken
                return tuple(None if x is None else x.new_zeros(len(host_mask)).index_copy(0, kept, x) for x in out)

            logp, entropy = pick(hidden, options.entropy_coef > 0)
            per_token, extra = job.fn(logp, inputs, options)
            if entropy is not None:
                per_token = per_token - options.entropy_coef * entropy
                extra = {**extra, "entropy": entropy}
            if options.kl_coef:
                base_logp, _ = pick(base, False)
                kl = k3_kl(logp, base_logp)
                per_token = per_token + options.kl_coef * kl
                extra = {**extra, "kl": kl}
            lengths = [d.model_input.length for d in data]
            loss = aggregate(per_token, mask, lengths, options.aggregation, total_tokens=options.batch_tokens or job.total_tokens,
                             total_sequences=options.batch_sequences or len(job.data))
            job.add(loss, per_token, mask, extra, indices, logp.detach().split(lengths))
            total = total + loss
        return total

    def _micro_batches(self, sequences: list[tuple[int, ...]], adapters: list[str]) -> list[list[int]]:
        """Indices of ``sequences`` in groups whose cost stays within the service's budget.

        A group costs T * (1 + L / 512) for T tokens computed and its longest sequence's length L:
        activations grow with the tokens and attention with the length (measured: 4 x 900 tokens
        peaked at 7.7 GB). Each adapter's sequences go in token order, so those that share
        prefixes sit together and each group's prefix tree (``prefix_tree.py``) computes only what
        is new in each; they are cut into groups as if that adapter were alone. With
        ``joint_passes``, whole groups of several adapters then share a pass where their costs fit
        together: a tree is never cut for another adapter's sake (cut, its shared prefixes would
        be computed twice).
        """
        groups: list[tuple[list[int], int, int]] = []  # (indices, tokens computed, longest)
        for adapter in sorted(set(adapters)):
            order = sorted((i for i in range(len(sequences)) if adapters[i] == adapter), key=lambda i: sequences[i])
            previous: tuple[int, ...] = ()
            start = len(groups)
            for i in order:
                tokens = sequences[i]
                new = len(tokens) - (prefix_tree.common_prefix(previous, tokens) if self.share_prefixes else 0)
                if len(groups) > start and self._fits(groups[-1][1] + new, max(groups[-1][2], len(tokens))):
                    indices, computed, longest = groups[-1]
                    groups[-1] = (indices + [i], computed + new, max(longest, len(tokens)))
                else:
                    groups.append(([i], len(tokens), len(tokens)))
                previous = tokens
        batches: list[tuple[list[int], int, int]] = []
        for indices, computed, longest in groups:
            if self.joint_passes and batches and self._fits(batches[-1][1] + computed, max(batches[-1][2], longest)):
                batches[-1] = (batches[-1][0] + indices, batches[-1][1] + computed, max(batches[-1][2], longest))
            else:
                batches.append((indices, computed, longest))
        return [indices for indices, _, _ in batches]

    def _fits(self, computed: int, longest: int) -> bool:
        return computed * (1 + longest / 512) <= self.micro_batch_tokens

    def _hidden(self, data: list[Datum], adapters: list[str] | None) -> torch.Tensor:
        """Flat last hidden states of ``data``, computed as a prefix tree: with ``adapters`` (one
        per datum), each row through its own adapter, only the adapters present stacked; without,
        the base model's."""
        tree = prefix_tree.build([d.model_input.tokens for d in data], share=self.share_prefixes,
                                 recompute=self.pass_tokens, keys=adapters)
        body = self.peft.get_base_model().model
        pad = self.loaded.tokenizer.pad_token_id or 0
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            if adapters is None:
                return prefix_tree.hidden_states(body, tree, self.device, pad)
            with routed(self.peft, list(dict.fromkeys(adapters)), self._lora_layers) as routing:
                return prefix_tree.hidden_states(body, tree, self.device, pad, routing.route)

    def _pick(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, bitmask: torch.Tensor | None,
        entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprobs of ``targets`` (and, with ``entropy``, the policy's entropy) at each row of
        ``hidden``: the action positions (in RL most positions are prompt, which never go through
        the LM head). ``bitmask`` rows (one per position) mask the softmax as the sampler's
        grammar did."""
        head = self.peft.get_base_model().lm_head
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            picked = token_logprobs(hidden, head, targets, temperature, chunk=self.logprob_chunk,
                                    bitmask=bitmask, entropy=entropy)
        return picked if entropy else (picked, None)

    def _grammar_masks(self, data: list[Datum], masks: list[torch.Tensor]) -> torch.Tensor | None:
        """The packed token masks each action token (mask > 0, in order) was sampled under.

        Replayed from the datums' GrammarSpans; all ones where decoding was free. None when no
        datum was constrained.
        """
        if not any(d.grammar for d in data):
            return None
        inner = self.peft.get_base_model()
        book = book_for(self.loaded.tokenizer, inner.get_output_embeddings().weight.shape[0])
        blocks = []
        for d, mask in zip(data, masks):
            actions = (mask > 0).nonzero().flatten().tolist()
            row_of = {pos: k for k, pos in enumerate(actions)}
            block = book.new_bitmask(len(actions))
            targets = d.tensor("target_tokens", torch.long).tolist()
            for span in d.grammar:
                end = span.start + span.length
                wanted = [p for p in range(span.start, end) if p in row_of]
                replayed = book.replay(span.json_schema, span.prefix, targets[span.start:end], [p - span.start for p in wanted],
                                       spelled=span.spelled)
                block[[row_of[p] for p in wanted]] = replayed
            blocks.append(block)
        return upload(torch.cat(blocks), self.device)

    def close(self) -> None:
        """Wait for every job submitted so far (jobs run in submission order)."""
        self._compute.submit(lambda: None).result()


class TrainingClient:
    def __init__(self, service: ServiceClient, name: str, lora: LoraConfig):
        self.service = service
        self.name = name
        self.lora = lora
        self.step = 0
        self.params = self.lora_params()
        # fused: its kernel can skip a step on the device (``found_inf``), with no sync to ask the host
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, fused=True)

    # -- the Tinker-shaped API -------------------------------------------------------------
    def forward_backward(self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None):
        return self.service.submit(self._forward, data, loss_fn, dict(loss_fn_config or {}), True)

    def forward(self, data: list[Datum], loss_fn: str = "cross_entropy", loss_fn_config: dict[str, Any] | None = None):
        return self.service.submit(self._forward, data, loss_fn, dict(loss_fn_config or {}), False)

    def optim_step(self, params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self.service.submit(self._optim_step, params)

    def save_state(self, path: str | Path) -> APIFuture[Path]:
        return self.service.submit(self._save_state, Path(path))

    def load_state(self, path: str | Path) -> APIFuture[int]:
        return self.service.submit(self._load_state, Path(path))

    def save_weights_for_sampler(self, path: str | Path) -> APIFuture[int | None]:
        return self.service.submit(self._save_for_sampler, Path(path))

    def save_weights(self, path: str | Path) -> APIFuture[Path]:
        """Write the adapter as ``save_weights_for_sampler`` does, leaving the engine as it is."""
        return self.service.submit(self._save_weights, Path(path))

    def push_to_sampler(self) -> APIFuture[int]:
        """The attached engine samples the adapter's current weights, as after
        ``save_weights_for_sampler``, with nothing written to disk (publishing with the file was a
        fifth of a GRPO step on the H100). Only where ``samples_in_process``; returns the new version."""
        return self.service.submit(self._push_to_sampler)

    @property
    def samples_in_process(self) -> bool:
        """Whether the attached engine keeps this adapter's weights in this process (the HF
        engine, once the adapter is in it), so that ``push_to_sampler`` can reach it."""
        return self.name in getattr(getattr(self.service.engine, "lora", None), "adapters", ())

    def perturb(self, std: float, seed: int | str) -> APIFuture[None]:
        """Add N(0, std^2) noise, seeded, to the adapter's LoRA B matrices (B starts at 0, so a
        fresh adapter is the base model; noise makes learners that start alike start apart)."""
        return self.service.submit(self._perturb, std, seed)

    async def forward_backward_async(self, *args: Any, **kwargs: Any) -> APIFuture[ForwardBackwardOutput]:
        return self.forward_backward(*args, **kwargs)

    async def forward_async(self, *args: Any, **kwargs: Any) -> APIFuture[ForwardBackwardOutput]:
        return self.forward(*args, **kwargs)

    async def optim_step_async(self, params: AdamParams) -> APIFuture[OptimStepResponse]:
        return self.optim_step(params)

    async def save_state_async(self, path: str | Path) -> APIFuture[Path]:
        return self.save_state(path)

    async def load_state_async(self, path: str | Path) -> APIFuture[int]:
        return self.load_state(path)

    async def save_weights_for_sampler_async(self, path: str | Path) -> APIFuture[int | None]:
        return self.save_weights_for_sampler(path)

    async def save_weights_async(self, path: str | Path) -> APIFuture[Path]:
        return self.save_weights(path)

    async def push_to_sampler_async(self) -> APIFuture[int]:
        return self.push_to_sampler()

    async def perturb_async(self, std: float, seed: int | str) -> APIFuture[None]:
        return self.perturb(std, seed)

    def lora_params(self, part: str | None = None) -> list[torch.nn.Parameter]:
        """This adapter's LoRA parameters (``part`` ``lora_A`` or ``lora_B``: one kind only), by
        PEFT's names, ``<module>.lora_A.<adapter>.weight``: an adapter named ``mlp`` or ``q_proj``,
        also a part of module names, takes none of another adapter's."""
        marks = tuple(f".{kind}.{self.name}." for kind in ((part,) if part else ("lora_A", "lora_B")))
        return [p for n, p in self.service.peft.named_parameters() if any(m in n for m in marks)]

    def get_tokenizer(self):
        return self.service.loaded.tokenizer

    # -- work done on the service's thread ----------------------------------------------------
    def _forward(self, data: list[Datum], loss_fn: str, config: dict[str, Any], backward: bool) -> ForwardBackwardOutput:
        return self.service._passes([(self, data, loss_fn, config)], backward)[0]

    def _perturb(self, std: float, seed: int | str) -> None:
        generator = torch.Generator().manual_seed(zlib.crc32(str(seed).encode()))
        with torch.no_grad():
            for p in self.lora_params("lora_B"):
                p.add_(torch.randn(p.shape, generator=generator).to(p) * std)

    def _optim_step(self, params: AdamParams) -> OptimStepResponse:
        for group in self.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                         weight_decay=params.weight_decay)
        # All on the device; the norm is read when the metrics are.
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if params.grad_clip_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, params.grad_clip_norm, norm)
        # A non-finite gradient (a bf16 overflow, a NaN out of the loss) would make every weight
        # NaN for good: that step is skipped, Adam's moments and step count untouched.
        skipped = (~torch.isfinite(norm)).float()
        self.optimizer.found_inf = skipped
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        read = Download([norm, skipped])
        return OptimStepResponse(self.step, later=lambda: dict(zip(("grad_norm", "skipped_step"), map(float, read.get()))))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """This adapter's weights in PEFT's saved format (keys without the adapter name), a tensor
        each (safetensors refuses shared storage)."""
        return {k: part.clone() for k, part in self._state_views().items()}

    def _state_views(self) -> dict[str, torch.Tensor]:
        """The adapter's weights on the host: one copy off a GPU for all of them, views of it.

        Named here, not by PEFT's ``get_peft_model_state_dict``: that drops every key holding
        another adapter's name (beside an adapter ``self_attn`` this one's file lacked its
        attention weights; beside ``layers``, in every key, it held every adapter's)."""
        marks = {f".{kind}.{self.name}.": f".{kind}." for kind in ("lora_A", "lora_B")}
        state = {n.replace(m, marks[m]): p.detach() for n, p in self.service.peft.named_parameters() for m in marks if m in n}
        return dict(zip(state, move_together(list(state.values()), torch.device("cpu"), torch.float32)))

    def _config(self) -> dict:
        """The adapter's PEFT config, as adapter_config.json holds it."""
        config = self.service.peft.peft_config[self.name].to_dict()
        config["target_modules"] = sorted(config["target_modules"]) if config.get("target_modules") else None
        return config

    def _write_adapter(self, folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
        """Write the adapter in PEFT's format; return what was written (weights, config)."""
        state, config = self.adapter_state(), self._config()
        folder.mkdir(parents=True, exist_ok=True)
        # renamed into place: a sampler dir rewritten at each checkpoint keeps its last whole weights
        # through a kill, and an engine or worker loading it meanwhile reads those
        # (in bytes: save_file's full disk was a SafetensorError, not an OSError naming the file)
        write_atomic(folder / "adapter_model.safetensors", save(state))
        write_atomic(folder / "adapter_config.json", json.dumps(config, indent=2, default=str))
        return state, config

    # what _save_state writes and load_state reads: a checkpoint lacking one is damaged
    STATE_FILES = ("state.json", "adapter_model.safetensors", "optimizer.pt", "rng.pt")

    def _save_state(self, path: Path) -> Path:
        """Adapter, optimizer, step and RNG state, written to a temp dir and renamed into place."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            self._write_adapter(tmp)
            save_torch(self.optimizer.state_dict(), tmp / "optimizer.pt")
            save_rng(tmp / "rng.pt")
            write_atomic(tmp / "state.json", json.dumps({"adapter": self.name, "step": self.step, "lora": asdict(self.lora)}))
            fsync_dir(tmp)
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
            fsync_dir(path.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _load_state(self, path: Path) -> int:
        # a file damaged since it was saved is a ValueError naming it: --resume passes the checkpoint over
        step, lora = read_saved(path / "state.json", _step_and_lora)
        # PEFT loads the weights whose names match and leaves the rest: other target modules loaded
        # nothing, another alpha loaded at another scale, another rank failed halfway through
        if (theirs := _lora_shape(lora)) != (ours := _lora_shape(asdict(self.lora))):
            raise RolecastError(f"{path} holds a LoRA of {theirs}; this adapter's is {ours}")
        weights = read_saved(path / "adapter_model.safetensors", lambda p: load_file(str(p)))
        set_peft_model_state_dict(self.service.peft, weights, adapter_name=self.name)
        # on the CPU first: a GPU run's moments would not load where there is no GPU; load_state_dict
        # moves them to the parameters' device
        saved = read_saved(path / "optimizer.pt", lambda p: torch.load(p, weights_only=False, map_location="cpu"))
        for group in saved["param_groups"]:
            group["fused"] = True  # a checkpoint from before the optimizer was fused
        self.optimizer.load_state_dict(saved)
        read_saved(path / "rng.pt", load_rng)
        self.step = step
        return self.step

    def _save_for_sampler(self, path: Path) -> int | None:
        """Write PEFT-format weights to ``path``; push them into the attached engine, if any."""
        state, config = self._write_adapter(path)
        engine = self.service.engine
        if engine is None:
            return None
        if self.samples_in_process:  # HFEngine: the weights in hand
            return engine.update_adapter(self.name, state, lora_scale(config))
        return engine.load_adapter(self.name, str(path))

    def _save_weights(self, path: Path) -> Path:
        self._write_adapter(path)
        return path

    def _push_to_sampler(self) -> int:
        if not self.samples_in_process:
            raise RuntimeError(f"push_to_sampler: the attached engine does not hold adapter {self.name!r} in this "
                               "process; use save_weights_for_sampler, which it can load from disk")
        return self.service.engine.update_adapter(self.name, self._state_views(), lora_scale(self._config()))


class _Job:
    """One ``forward_backward`` call inside a pass: its adapter, datums and loss, checked up
    front, and what the pass's micro-batches add up for it."""

    def __init__(self, client: TrainingClient, data: list[Datum], loss_fn: str, config: dict[str, Any]):
        if loss_fn not in LOSS_FNS:
            raise ValueError(f"unknown loss_fn {loss_fn!r}: use one of {', '.join(LOSS_FNS)}")
        if not data:
            raise ValueError("forward_backward needs at least one Datum")
        # no position, nothing predicted: alone in a call it left the prefix tree without a segment
        # and the pass failed on "max() arg is an empty sequence"; beside others it counted in
        # sequence-mean's divisor
        if empty := [i for i, d in enumerate(data) if not d.model_input.length]:
            raise ValueError(f"datum {empty[0]}: model_input holds no tokens: a datum needs one position at least")
        self.fn, self.needed = LOSS_FNS[loss_fn]
        self.options = LOSS_CONFIGS[loss_fn].model_validate(config)  # a ValueError on an unknown key or a bad value
        for key in ("target_tokens", *self.needed):
            missing = [i for i, d in enumerate(data) if key not in d.loss_fn_inputs]
            if missing:
                raise ValueError(f"loss {loss_fn!r} needs loss_fn_inputs[{key!r}] (missing in datum {missing[0]})")
        self.adapter, self.data = client.name, data
        # Every datum's tensors read, their shapes checked, before any pass: a bad one met in a later
        # micro-batch left the earlier micro-batches' gradients in the adapter.
        self.masks = [d.mask() for d in data]
        self.inputs = {key: [d.tensor(key, torch.long if key == "target_tokens" else torch.float32) for d in data]
                       for key in ("target_tokens", *self.needed)}
        # and their token ids: out of range, an embedding or the LM head fails mid-pass (on a GPU, a
        # device-side assert that takes the whole process along)
        model = client.service.loaded.model
        _in_vocab("model_input", [torch.tensor(d.model_input.tokens) for d in data],
                  model.get_input_embeddings().num_embeddings)
        _in_vocab("target_tokens", [t[m > 0] for t, m in zip(self.inputs["target_tokens"], self.masks)],
                  model.get_output_embeddings().weight.shape[0])
        self.total_tokens = float(sum(m.sum() for m in self.masks))
        self.sums: dict[str, torch.Tensor] = {}  # on the device, read once the job's passes are done
        self.logps: list[torch.Tensor] = [torch.empty(0)] * len(data)

    def add(self, loss: torch.Tensor, per_token: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor],
            indices: list[int], logps: tuple[torch.Tensor, ...]) -> None:
        """A micro-batch's share: its loss, per-token metrics, and the logprobs of datums ``indices``."""
        sums = {"loss": loss.detach(), "loss:sum": (per_token.detach() * mask).sum(),
                **{key: (value.detach() * mask).sum() for key, value in extra.items()}}
        for key, value in sums.items():
            self.sums[key] = self.sums[key] + value if key in self.sums else value
        for i, lp in zip(indices, logps):
            self.logps[i] = lp

    def output(self) -> ForwardBackwardOutput:
        """The job's logprobs and metrics, on their way to the host in two copies: the service's
        thread does not wait for them (a GPU idled while it did, and the next call's host work
        waited with it); the first read of the output does."""
        lengths, names, tokens = [len(lp) for lp in self.logps], list(self.sums), self.total_tokens
        sent = Download([torch.cat(self.logps), torch.stack(list(self.sums.values())).float()])

        def arrived() -> dict[str, Any]:
            logps, sums = sent.get()
            named = dict(zip(names, sums.tolist()))
            metrics = {"loss": named.pop("loss"), "loss:sum": named.pop("loss:sum"), "tokens": tokens}
            if tokens:  # no means over no action tokens: a ratio_mean of 0.0 read as a collapsed policy
                for key, value in named.items():
                    metrics[key if key in MEAN_NAMED else f"{key}_mean"] = value / tokens
            return {"loss_fn_outputs": [{"logprobs": lp} for lp in logps.split(lengths)], "metrics": metrics}

        return ForwardBackwardOutput(later=arrived)


def _step_and_lora(path: Path) -> tuple[int, dict[str, Any]]:
    state = json.loads(path.read_text())
    return int(state["step"]), state["lora"]


def _lora_shape(lora: dict[str, Any]) -> str:
    """What makes a LoRA's saved weights mean one thing (its dropout does not)."""
    return f"rank {int(lora['rank'])}, alpha {float(lora['alpha'])} on {', '.join(sorted(lora['target_modules']))}"


def _in_vocab(what: str, ids: list[torch.Tensor], vocab: int) -> None:
    for i, t in enumerate(ids):
        if t.numel() and not (0 <= int(t.min()) and int(t.max()) < vocab):
            bad = next(v for v in t.tolist() if not 0 <= v < vocab)
            raise ValueError(f"datum {i}: {what} holds token id {bad}, outside the model's vocabulary (0 to {vocab - 1})")
