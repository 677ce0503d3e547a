"""orchestrator/upload.py off CUDA: host_tensor gives what torch.tensor gives, only faster; a Download
is the tensors in hand."""
import numpy as np
import pytest
import torch
from orchestrator.upload import Download, host_tensor, move_together, upload


@pytest.mark.parametrize("values", [[1, 2, 3], [[1, 2], [3, 4]], [0.5, -1.0], [[0.25], [2.0]], [True, False], [], [7]])
def test_host_tensor_picks_torch_tensors_dtype_and_shape(values):
    want, got = torch.tensor(values), host_tensor(values)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16])
def test_host_tensor_takes_the_dtype_asked_for(dtype):
    values = [[0, 1, 2], [3, 0, 5]]
    got = host_tensor(values, dtype)
    assert got.dtype == dtype and torch.equal(got, torch.tensor(values, dtype=dtype))


def test_tensors_and_arrays_pass_through():
    t = torch.arange(4)
    assert host_tensor(t) is t and host_tensor(t, torch.float32).dtype == torch.float32
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert torch.equal(host_tensor(a), torch.arange(6).reshape(2, 3))
    assert host_tensor(np.array([0.5])).dtype == torch.tensor(np.array([0.5])).dtype == torch.float64
    assert upload(a, torch.device("cpu"), torch.float32).dtype == torch.float32


def test_ragged_lists_are_refused():
    with pytest.raises(ValueError):
        host_tensor([[1, 2], [3]])


def test_a_download_off_a_gpu_is_the_tensors_in_hand_detached():
    x = torch.arange(3.0, requires_grad=True)
    got, empty = Download([x * 2, torch.zeros(0)]).get()
    assert torch.equal(got, torch.tensor([0.0, 2.0, 4.0])) and not got.requires_grad and empty.numel() == 0
    assert Download([]).get() == ()


def test_move_together_gives_each_tensor_back_in_its_shape_and_the_dtype_asked_for():
    """One flat copy, cut back into views: each in its own place, shape and values."""
    w = torch.arange(6.0, requires_grad=True).reshape(2, 3)
    parts = [w * 2, torch.tensor([7, 8, 9], dtype=torch.int64), torch.tensor(0.5, dtype=torch.bfloat16)]
    moved = move_together(parts, torch.device("cpu"), torch.float64)  # not the float32 torch.cat would make
    assert [m.shape for m in moved] == [p.shape for p in parts] and all(m.dtype == torch.float64 for m in moved)
    assert all(torch.equal(m, p.detach().double()) for m, p in zip(moved, parts)) and not moved[0].requires_grad
