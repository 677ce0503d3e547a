"""Many LoRA adapters on one frozen base model, for serving: rows of a batch pick their adapter.

Each target ``nn.Linear`` gets a forward hook that adds the LoRA delta of each row's adapter.
The adapters present in a batch are stacked side by side (``A`` as ``[in, R]``, ``B`` as
``[R, out]``, ``R`` the sum of their ranks), so every module costs two matmuls whatever the mix:
``h = x @ A``, zero the columns of other adapters in each row (one multiply by a row mask built
once per forward pass in ``route``), ``out += h @ B``. Measured on SmolLM2's layer shapes at
batch 64 (bf16, 1 thread): a 4-adapter mix cost 0.94x a single adapter this way, versus 0.78x
with one pair of matmuls per adapter on its rows, and PEFT's ``adapter_names`` path made a decode
step 1.6x slower. The engine's fused decode step (``decoder.py``) calls no modules, so it calls
``add_delta`` itself. Weights come in PEFT's format (``adapter_config.json`` +
``adapter_model.safetensors``), so what the trainer saves is what the engine serves.
"""
from __future__ import annotations

import json
import math
import pickle
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..upload import move_together, upload

_STACKS_KEPT = 8  # stacked weights of recent adapter mixes (a mix is rebuilt when it comes back)


@dataclass
class _Weights:
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r], already multiplied by the LoRA scale


Key = str | tuple[str, ...]  # a module name, or a group of modules (``MultiLoRA.group``)


@dataclass
class _Stack:
    """Several adapters side by side: per module ``a_t`` [in, R] and ``b_t`` [R, out]; per group of
    n modules ``a_t`` [in, n R] (theirs side by side) and ``b_t`` [n R, sum of outs] (block-diagonal)."""

    a_t: dict[Key, torch.Tensor]
    b_t: dict[Key, torch.Tensor]
    columns: dict[str, slice]  # adapter -> its columns in R
    width: int  # R


class MultiLoRA:
    def __init__(self, model: torch.nn.Module):
        if getattr(model, "_rolecast_lora", None) is not None:  # its hooks would add their deltas too
            raise ValueError("this model already serves an open engine: close that engine first, or load another copy")
        model._rolecast_lora = self
        self.model = model
        first = next(model.parameters())
        self.dtype, self.device = first.dtype, first.device  # stacks and row masks live beside the model
        self.linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name != "lm_head"}
        self.adapters: dict[str, dict[str, _Weights]] = {}  # adapter -> module name -> weights
        self._stacks: OrderedDict[tuple[str, ...], _Stack] = OrderedDict()
        self._groups: set[tuple[str, ...]] = set()
        self._active: tuple[_Stack, dict[int, torch.Tensor] | None] | None = None  # row masks by width
        self.version = 0  # bumps on every change of any adapter's weights (SlotLoRA copies on a change)
        self._hooks = [module.register_forward_hook(self._hook(name)) for name, module in self.linears.items()]

    def detach(self) -> None:
        """Remove the hooks: the model is a plain model again (another engine may serve it)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if getattr(self.model, "_rolecast_lora", None) is self:
            self.model._rolecast_lora = None

    # -- routing -------------------------------------------------------------------------------
    def route(self, adapters: list[str | None]) -> None:
        """Set which adapter each row of the next forward passes uses (None: the base model)."""
        names = [a if a in self.adapters and self.adapters[a] else None for a in adapters]
        present = tuple(dict.fromkeys(n for n in names if n is not None))
        if not present:
            self._active = None
            return
        stack = self._stack(present)
        masks = None
        if len(present) > 1 or None in names:
            mask = torch.zeros(len(names), stack.width, dtype=self.dtype, device=self.device)
            for row, name in enumerate(names):
                if name is not None:
                    mask[row, stack.columns[name]] = 1
            masks = {stack.width: mask}
        self._active = (stack, masks)

    def group(self, modules: tuple[str, ...]) -> tuple[str, ...]:
        """Register modules that read the same input and write adjacent columns of one output, in
        this order (the fused decode step's q/k/v and gate/up): ``add_delta(group, ...)`` then costs
        two matmuls for all of them, not two each. One adapter's deltas over SmolLM2's 30 layers at
        61 rows: 13.8 ms per step grouped, 19.3 ms module by module; a four-adapter mix, 37.8 vs
        38.2 ms (there the stack's width, not the number of calls, is the cost)."""
        if modules not in self._groups:
            self._groups.add(modules)
            self._changed()
        return modules

    def _stack(self, present: tuple[str, ...]) -> _Stack:
        if present in self._stacks:
            self._stacks.move_to_end(present)
            return self._stacks[present]
        ranks = {n: max(w.a.shape[0] for w in self.adapters[n].values()) for n in present}
        columns, at = {}, 0
        for n in present:
            columns[n], at = slice(at, at + ranks[n]), at + ranks[n]
        a_t, b_t = {}, {}
        for module in dict.fromkeys(m for n in present for m in self.adapters[n]):
            linear = self.linears[module]
            a = torch.zeros(at, linear.in_features, dtype=self.dtype, device=self.device)
            b = torch.zeros(at, linear.out_features, dtype=self.dtype, device=self.device)
            for n in present:
                w = self.adapters[n].get(module)
                if w is not None:  # an adapter that skips a module (or has a lower rank there) adds zeros
                    rows = slice(columns[n].start, columns[n].start + w.a.shape[0])
                    a[rows], b[rows] = w.a, w.b.T
            a_t[module], b_t[module] = a.T.contiguous(), b
        for group in self._groups:
            if any(m in a_t for m in group):
                a_t[group], b_t[group] = self._group_stack(group, a_t, b_t, at)
        self._stacks[present] = stack = _Stack(a_t, b_t, columns, at)
        if len(self._stacks) > _STACKS_KEPT:
            self._stacks.popitem(last=False)
        return stack

    def _group_stack(self, group: tuple[str, ...], a_t: dict, b_t: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        linears = [self.linears[m] for m in group]
        a = torch.cat([a_t[m] if m in a_t else torch.zeros(lin.in_features, rank, dtype=self.dtype, device=self.device)
                       for m, lin in zip(group, linears)], dim=1)
        b = torch.zeros(len(group) * rank, sum(lin.out_features for lin in linears), dtype=self.dtype, device=self.device)
        col = 0
        for i, (m, lin) in enumerate(zip(group, linears)):
            if m in b_t:
                b[i * rank:(i + 1) * rank, col:col + lin.out_features] = b_t[m]
            col += lin.out_features
        return a, b

    def begin(self, rows: int, mode: str = "mixed", per_row: int = 1) -> None:
        """A forward pass over ``rows`` rows starts (the row masks were built by ``route``)."""

    def add_delta(self, key: Key, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out += `` each row's LoRA delta for ``x``, the input of module (or group) ``key``, in place.

        ``x`` is [rows, in] or [rows, tokens, in]; ``out`` is the module's output, or a group's:
        its modules' outputs side by side.
        """
        if self._active is None:
            return
        stack, masks = self._active
        a_t = stack.a_t.get(key)
        if a_t is None:
            return
        h = x @ a_t
        if masks is not None:
            mask = masks.get(h.shape[-1])
            if mask is None:  # a group's columns: the row mask once per module
                masks[h.shape[-1]] = mask = masks[stack.width].repeat(1, h.shape[-1] // stack.width)
            h.mul_(mask if h.dim() == 2 else mask[:, None])
        # in place: the serving path runs under inference_mode, nothing needs the old output
        flat = out if out.dim() == 2 else out.view(-1, out.shape[-1])
        flat.addmm_(h.view(-1, h.shape[-1]), stack.b_t[key])

    def _hook(self, module_name: str):
        def add_lora(module, inputs, output):
            self.add_delta(module_name, inputs[0], output)
            return output

        return add_lora

    # -- adapters ------------------------------------------------------------------------------
    def set_empty(self, name: str) -> None:
        """A fresh adapter: B = 0, so it adds nothing (and costs nothing) until trained."""
        self.adapters[name] = {}
        self._changed()

    def set_state(self, name: str, state: dict[str, torch.Tensor], scale: float) -> None:
        """Install PEFT-format weights (``...<module>.lora_A.weight`` / ``lora_B``) for ``name``."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in state.items():
            for part in ("lora_A", "lora_B"):
                marker = f".{part}."
                if marker in key:
                    module = key.split(marker)[0].removeprefix("base_model.model.")
                    pairs.setdefault(module, {})[part] = tensor
        unknown = sorted(set(pairs) - set(self.linears))
        if "lm_head" in unknown:  # the model has one: the engine adds no LoRA there (training leaves it frozen)
            raise ValueError(f"adapter {name!r} has LoRA on lm_head, which the engine does not compute: LoRA on "
                             "the model's inner linear layers only")
        if unknown:
            raise KeyError(f"adapter {name!r} targets modules the model does not have: {unknown[:3]}")
        for module, p in pairs.items():
            if "lora_A" not in p or "lora_B" not in p:
                raise KeyError(f"adapter {name!r}: module {module} lacks lora_A or lora_B")
            linear, a, b = self.linears[module], p["lora_A"], p["lora_B"]
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or \
                    (a.shape[1], b.shape[0]) != (linear.in_features, linear.out_features):
                raise ValueError(f"adapter {name!r} does not fit this model (trained on another base model?): {module} "
                                 f"maps {linear.in_features} -> {linear.out_features} features, its lora_A is "
                                 f"{tuple(a.shape)} and lora_B {tuple(b.shape)}")
        # B = 0 (a fresh adapter): its delta is zero, skip the matmuls
        live = [m for m, p in pairs.items() if p["lora_B"].any()]
        weights = {}
        if live:  # all of them in one copy to the device (a copy each waited for the GPU: 420 for SmolLM2)
            parts = [t for m in live for t in (pairs[m]["lora_A"], pairs[m]["lora_B"].float() * scale)]
            pieces = move_together(parts, self.device, self.dtype)
            weights = {m: _Weights(a=pieces[2 * i], b=pieces[2 * i + 1]) for i, m in enumerate(live)}
        self.adapters[name] = weights
        self._changed()

    def load(self, name: str, path: str | Path) -> None:
        path = Path(path)
        config = json.loads((path / "adapter_config.json").read_text())
        state = read_weights(path)
        check_plain_lora(config, state)
        self.set_state(name, state, lora_scale(config))

    def remove(self, name: str) -> None:
        del self.adapters[name]
        self._changed()

    def _changed(self) -> None:
        """Adapter weights changed: stacked copies are stale (the engine holds its lock here)."""
        self._stacks.clear()
        self._active = None
        self.version += 1


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """An adapter dir's weights: ``adapter_model.safetensors``, or the ``adapter_model.bin`` older
    PEFT wrote (as vLLM takes it; unpickled with ``weights_only``, which builds tensors and runs no
    code). ValueError, one line, for neither or one that does not read."""
    weights = path / "adapter_model.safetensors"
    if weights.is_file():
        try:
            return load_file(str(weights))
        except SafetensorError as exc:  # truncated or corrupt (a save or copy cut short)
            raise ValueError(f"cannot read {weights}: {exc}") from None
    weights = path / "adapter_model.bin"
    if not weights.is_file():
        raise ValueError(f"no adapter_model.safetensors (or .bin) in {path}")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:  # cut short, another format, or code in it
        raise ValueError(f"cannot read {weights}: not a torch file of tensors ({type(exc).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"cannot read {weights}: not a mapping of names to tensors")
    return state


def check_plain_lora(config: dict, state: dict[str, torch.Tensor]) -> None:
    """Raise ValueError unless the adapter is what the engine computes: LoRA A and B on linear
    layers, one rank and alpha (DoRA's magnitudes, embedding LoRA, fully trained modules and
    per-module ranks were read as plain LoRA, or left out: another model, silently)."""
    for key, what in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save (fully trained layers)"),
                      ("rank_pattern", "per-module ranks (rank_pattern)"), ("alpha_pattern", "per-module alphas (alpha_pattern)")):
        if config.get(key):
            raise ValueError(f"the adapter uses {what}, which the engine does not compute: plain LoRA only")
    # the weights alone: a lora_B.bias (PEFT's lora_bias) was read as lora_B, or overwritten by it
    other = sorted(k for k in state if not k.endswith((".lora_A.weight", ".lora_B.weight")))
    if other:
        raise ValueError(f"the adapter holds weights that are not LoRA A/B on a linear layer ({other[0]}, "
                         f"{len(other)} in all): plain LoRA only")
    if not state:
        raise ValueError("the adapter holds no LoRA weights")
    check_rank_and_alpha(config, {t.shape[0] for k, t in state.items() if k.endswith(".lora_A.weight") and t.dim()})


def check_rank_and_alpha(config: dict, ranks: set[int]) -> None:
    """Raise ValueError unless the config's r (PEFT's default 8 where absent) is the rank of the
    weights ``ranks`` and its lora_alpha a number above 0: r 0 or a string was a traceback, another
    rank or a negative one scaled the delta wrong (PEFT refuses such a dir), alpha 0 served the base
    model under the adapter's name."""
    r, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if ranks != {r} or isinstance(r, bool):
        said = f"r {r!r}" if "r" in config else "no r (PEFT's default: 8)"
        raise ValueError(f"its adapter_config.json says {said}, its lora_A weights have rank "
                         f"{', '.join(map(str, sorted(ranks)))}: r is the rank of its weights")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < math.inf:
        raise ValueError(f"its adapter_config.json says lora_alpha {alpha!r}: a number above 0")


def lora_scale(config: dict) -> float:
    """alpha / r, or alpha / sqrt(r) for rank-stabilised LoRA (PEFT's adapter_config.json keys)."""
    r, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


class SlotLoRA:
    """Every adapter of a ``MultiLoRA`` in a fixed slot of stacks that never move, for decode
    steps replayed as CUDA graphs (a graph replays the addresses it was captured with).

    Per module (or group) ``a_t`` is ``[in, C R]`` and ``b_t`` ``[C R, out]`` (block-diagonal for a
    group), C slots of rank R (an adapter of lower rank pads with zeros). A row's slot lives on
    the device (``rows``), so the row masks are built inside the step (``begin``) and a batch may
    mix any adapters: two matmuls per module, whatever the mix. New weights for an adapter are
    copied into its slot in place; only more adapters, a higher rank or new target modules
    allocate new stacks (``generation`` bumps: the engine recaptures its graphs).
    """

    def __init__(self, lora: MultiLoRA, rows: int):
        self.lora = lora
        self.rows = torch.full((rows,), -1, dtype=torch.long, device=lora.device)  # each row's slot; -1: base
        self.slots: dict[str, int] = {}
        self.capacity = self.rank = 0
        self.a_t: dict[Key, torch.Tensor] = {}
        self.b_t: dict[Key, torch.Tensor] = {}
        self.generation = 0
        self._columns = torch.zeros(0, dtype=torch.long, device=lora.device)  # the slot of each of the C R columns
        self._masks: dict[int, torch.Tensor] = {}
        self._synced = -1

    def sync(self) -> None:
        """Bring the slots up to date with the adapters' weights (nothing to do if unchanged)."""
        if self._synced == self.lora.version:
            return
        adapters = {n: w for n, w in self.lora.adapters.items() if w}  # an empty adapter is the base model
        rank = max((w.a.shape[0] for ws in adapters.values() for w in ws.values()), default=0)
        keys = self._keys(adapters)
        if len(adapters) > self.capacity or rank > self.rank or set(keys) != set(self.a_t):
            self._allocate(keys, max(len(adapters), 1), rank)
        for name in [n for n in self.slots if n not in adapters]:
            del self.slots[name]
        free = iter(sorted(set(range(self.capacity)) - set(self.slots.values())))
        for name in adapters:
            if name not in self.slots:
                self.slots[name] = next(free)
        for key in keys:
            a, b = self._stacked(key, adapters)
            self.a_t[key].copy_(a)
            self.b_t[key].copy_(b)
        self._synced = self.lora.version

    def route(self, adapters: list[str | None], rows: int) -> None:
        """Set the slots of the step's ``rows`` rows: ``adapters`` for the first, base for the rest."""
        slots = [self.slots.get(a, -1) if a is not None else -1 for a in adapters]
        self.rows[:rows].copy_(upload(slots + [-1] * (rows - len(slots)), self.rows.device))

    def mode(self, adapters: list[str | None]) -> str:
        """How a step over rows with these adapters adds LoRA: ``none`` (no row has one), ``one``
        (one slot, every row in it: no row mask, the bucket's idle rows get the adapter too and are
        ignored), ``mixed`` (row masks). Part of a graph's shape: ``begin`` reads it."""
        used = {a in self.slots for a in adapters}
        if True not in used:
            return "none"
        return "one" if self.capacity == 1 and used == {True} else "mixed"

    def begin(self, rows: int, mode: str = "mixed", per_row: int = 1) -> None:
        """Row masks for a step over ``rows`` rows of ``per_row`` tokens each (per width: one slot's
        columns, repeated per group member), or none in mode ``one``."""
        if not self.capacity or mode == "one":
            self._masks = {}
            return
        mask = (self._columns[None, :] == self.rows[:rows, None]).to(self.lora.dtype)
        if per_row > 1:  # a prefill chunk: each token of a row takes the row's mask (one copy, no host read)
            mask = mask[:, None].expand(rows, per_row, mask.shape[1]).reshape(rows * per_row, mask.shape[1])
        widths = {t.shape[1] for t in self.a_t.values()}
        self._masks = {w: mask if w == mask.shape[1] else mask.repeat(1, w // mask.shape[1]) for w in widths}

    def add_delta(self, key: Key, x: torch.Tensor, out: torch.Tensor) -> None:
        a_t = self.a_t.get(key)
        if a_t is None:
            return
        h = x @ a_t
        if self._masks:
            h.mul_(self._masks[h.shape[-1]])
        out.addmm_(h, self.b_t[key])

    def _keys(self, adapters: dict[str, dict[str, _Weights]]) -> list[Key]:
        """The groups, and the modules outside them, that some adapter has weights for."""
        targeted = {m for ws in adapters.values() for m in ws}
        grouped = {m for g in self.lora._groups for m in g}
        return ([g for g in self.lora._groups if targeted & set(g)] +
                sorted(m for m in targeted if m not in grouped))

    def _allocate(self, keys: list[Key], capacity: int, rank: int) -> None:
        self.capacity, self.rank = capacity, rank
        self.slots = {}
        self.a_t, self.b_t = {}, {}
        for key in keys:
            a, b = self._stacked(key, {})
            self.a_t[key], self.b_t[key] = a, b
        self._columns = torch.arange(capacity, device=self.lora.device).repeat_interleave(rank)
        self.generation += 1

    def _stacked(self, key: Key, adapters: dict[str, dict[str, _Weights]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``key``'s stacks for the adapters in their slots (zeros where a slot is empty)."""
        modules = key if isinstance(key, tuple) else (key,)
        width = self.capacity * self.rank
        lora = self.lora
        a = torch.zeros(lora.linears[modules[0]].in_features, len(modules) * width, dtype=lora.dtype, device=lora.device)
        b = torch.zeros(len(modules) * width, sum(lora.linears[m].out_features for m in modules),
                        dtype=lora.dtype, device=lora.device)
        out = 0
        for i, module in enumerate(modules):
            for name, slot in self.slots.items():
                w = adapters.get(name, {}).get(module)
                if w is not None:
                    at = i * width + slot * self.rank
                    a[:, at:at + w.a.shape[0]] = w.a.T
                    b[at:at + w.a.shape[0], out:out + w.b.shape[0]] = w.b.T
            out += lora.linears[module].out_features
        return a, b


class _NoLoRA:
    """The adapter hooks of a step in which no row uses an adapter: nothing to add."""

    def begin(self, rows: int, mode: str = "none", per_row: int = 1) -> None:
        pass

    def add_delta(self, key: Key, x: torch.Tensor, out: torch.Tensor) -> None:
        pass


NO_LORA = _NoLoRA()
