"""The TorchTPU stand-in device (torchtpu_plugins.standin): real "tpu" tensors computing on CPU kernels.

Each result on "tpu" is compared with the same computation on CPU: the stand-in runs torch's CPU
kernels, so the two are equal bit for bit. The stand-in is installed in this process (by the autoload
entry point when TORCHTPU_PLUGINS_DEVICE=cpu, as in tox; otherwise by the module fixture).
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from conftest import HAS_TORCHTPU_STANDIN

if not HAS_TORCHTPU_STANDIN:  # named on the command line in a cell without it (tests/ alone never collects it)
    pytest.skip("torchtpu-plugins with torch >= 2.11 is not installed", allow_module_level=True)

from torchtpu_plugins.runtime import _torch_contract  # noqa: E402

pytestmark = pytest.mark.torchtpu


@pytest.fixture(scope="module", autouse=True)
def standin():
    from torchtpu_plugins import standin

    standin.install()
    assert standin.installed()
    return standin


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_torch_contract_holds_on_the_installed_torch():
    assert _torch_contract.missing() == []
    _torch_contract.check()


def test_torch_contract_names_a_name_torch_dropped(monkeypatch):
    monkeypatch.setattr(_torch_contract, "NAMES", (*_torch_contract.NAMES, "_C._no_such_name_in_torch"))
    assert _torch_contract.missing() == ["torch._C._no_such_name_in_torch"]
    with pytest.raises(RuntimeError, match=r"torch\._C\._no_such_name_in_torch.*torch>=2\.11,<2\.16"):
        _torch_contract.check()


def test_tensors_are_tpu_tensors_and_ops_equal_cpu():
    cpu = torch.randn(4, 5)
    tpu = cpu.to("tpu")
    assert tpu.device == torch.device("tpu", 0) and tpu.is_tpu
    result = (tpu @ tpu.T).softmax(-1).sum(0) + tpu[:, 1:3].mean()
    assert result.device.type == "tpu"
    assert torch.equal(result.cpu(), (cpu @ cpu.T).softmax(-1).sum(0) + cpu[:, 1:3].mean())
    assert tpu.tolist() == cpu.tolist() and tpu.sum().item() == cpu.sum().item()


def test_views_share_the_tpu_memory():
    base = torch.zeros(3, 4, device="tpu")
    column = base[:, 2]
    column.add_(5)
    base.T[0].fill_(1)
    expected = torch.zeros(3, 4)
    expected[:, 2] += 5
    expected.T[0].fill_(1)
    assert column.device.type == "tpu" and column._base is base
    # one storage (which keeps the memory alive for the view), not a second one over the same bytes
    assert column.untyped_storage()._cdata == base.untyped_storage()._cdata
    assert torch.equal(base.cpu(), expected)


def test_out_results_grow():
    a = torch.arange(6.0).reshape(2, 3)
    out = torch.empty(0, device="tpu")
    returned = torch.mul(a.to("tpu"), 2, out=out)
    assert returned is out and out.shape == (2, 3) and torch.equal(out.cpu(), a * 2)


def test_inference_tensors_and_their_views():
    x = torch.arange(4.0, device="tpu")
    with torch.inference_mode():
        y = x * 2
        view = y[1:]
    assert y.is_inference() and view.is_inference()
    assert torch.equal((view + 1).cpu(), torch.tensor([3.0, 5.0, 7.0]))


def test_autograd_and_optimizer_steps_equal_cpu():
    states = {}
    for device in ("cpu", "tpu"):
        model = _model().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # AdamW imports torch._dynamo (~10 s)
        data = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(3):
            x, y = torch.randn(5, 6, generator=data).to(device), torch.randn(5, 2, generator=data).to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert all(p.device.type == device and p.grad.device.type == device for p in model.parameters())
        assert all(v.device.type == device for s in optimizer.state.values() for v in s.values() if v.dim())
        states[device] = (losses, {k: v.cpu() for k, v in model.state_dict().items()})
    assert states["tpu"][0] == states["cpu"][0]
    assert all(torch.equal(states["tpu"][1][k], v) for k, v in states["cpu"][1].items())


def test_deepcopy_and_storage_clone_are_independent_tpu_copies():
    model = _model().to("tpu")
    twin = copy.deepcopy(model)  # ModelCheckpoint deep-copies state: a storage without allocator crashed here
    assert twin[0].weight.device.type == "tpu"
    assert torch.equal(twin[0].weight.cpu(), model[0].weight.cpu())
    with torch.no_grad():
        model[0].weight.add_(1)
    assert not torch.equal(twin[0].weight.cpu(), model[0].weight.cpu())
    storage = torch.arange(3.0, device="tpu").untyped_storage()
    clone = storage.clone()
    assert clone.device.type == "tpu" and clone.data_ptr() != storage.data_ptr()
    assert bytes(clone.cpu()) == bytes(storage.cpu())
    assert torch.UntypedStorage(16, device="tpu").device.type == "tpu"


def test_save_load_to_cpu_and_back():
    model = _model().to("tpu")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert {v.device.type for v in on_cpu.values()} == {"cpu"}
    buffer.seek(0)
    on_tpu = torch.load(buffer)
    assert {v.device.type for v in on_tpu.values()} == {"tpu"}
    fresh = _model()
    fresh.load_state_dict(on_cpu)
    fresh.to("tpu")
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name].cpu(), value.cpu()) and torch.equal(on_tpu[name].cpu(), value.cpu())


def test_bf16_autocast_casts_like_cpu_autocast():
    model = _model()
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    results = {}
    for device in ("cpu", "tpu"):
        model.to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            out = model(x.to(device))
            # both bf16: only autocast's float32 list keeps the loss in float32
            loss = torch.nn.functional.mse_loss(out, y.to(device, torch.bfloat16))
        results[device] = (out.dtype, loss.dtype, out.float().cpu(), loss.cpu())
    assert results["tpu"][:2] == (torch.bfloat16, torch.float32)
    assert results["tpu"][:2] == results["cpu"][:2]
    assert torch.equal(results["tpu"][2], results["cpu"][2]) and torch.equal(results["tpu"][3], results["cpu"][3])
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16


def test_convolution_forward_and_backward_equal_cpu():
    grads = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        conv = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.ConvTranspose2d(3, 2, 2)).to(device)
        x = torch.arange(50.0).reshape(1, 2, 5, 5).div(50).to(device).requires_grad_()
        out = conv(x)
        out.square().sum().backward()
        grads[device] = [t.cpu() for t in (out, x.grad, conv[0].weight.grad, conv[1].bias.grad)]
        assert out.device.type == device
    assert all(torch.equal(a, b) for a, b in zip(grads["tpu"], grads["cpu"], strict=True))


def test_random_numbers_follow_torch_manual_seed_and_fork_rng():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when seeding does not reach a device module
        torch.manual_seed(7)
    first = torch.rand(3, device="tpu")
    torch.manual_seed(7)
    assert torch.equal(first.cpu(), torch.rand(3))
    with torch.random.fork_rng(device_type="tpu"):
        inside = torch.randn(2, device="tpu")
    assert torch.equal(torch.randn(2, device="tpu").cpu(), inside.cpu())


def test_torch_accelerator_reports_the_tpu_device():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == 1
    assert torch.accelerator.current_device_index() == 0


def test_torch_accelerator_synchronize_is_a_known_limit():
    # torch has no Python hook for it: a device registered from Python cannot synchronise (TorchTPU can)
    with pytest.raises(RuntimeError, match="doesn't support synchronizing"):
        torch.accelerator.synchronize()


def test_legacy_device_module_functions_raise_from_user_code():
    for function in (torch.tpu.is_available, torch.tpu.device_count, torch.tpu.current_device, torch.tpu.initial_seed):
        with pytest.raises(RuntimeError, match=r"legacy device API.*torch\.accelerator"):
            function()


def test_device_count_variable_is_checked(monkeypatch):
    from torchtpu_plugins.standin import _device_module

    monkeypatch.setenv("TORCHTPU_PLUGINS_DEVICE_COUNT", "4")
    assert _device_module._count() == 4
    for bad in ("0", "four"):
        monkeypatch.setenv("TORCHTPU_PLUGINS_DEVICE_COUNT", bad)
        with pytest.raises(ValueError, match=rf"TORCHTPU_PLUGINS_DEVICE_COUNT='{bad}'.*integer >= 1"):
            _device_module._count()


def test_a_storage_resized_to_nothing_or_its_own_size_keeps_its_memory_and_values_as_fsdp2_needs():
    x = torch.arange(3.0, device="tpu")
    storage = x.untyped_storage()
    assert storage.resize_(0) is storage and storage.resize_(12) is storage  # FSDP2's free, then re-allocation
    assert storage.nbytes() == 12 and torch.equal(x.cpu(), torch.arange(3.0))
    cpu = torch.ones(2).untyped_storage()
    assert cpu.resize_(0).nbytes() == 0  # other devices' storages resize as torch does


def test_what_the_standin_cannot_do_raises_instead_of_crashing():
    x = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="binds each process to device tpu:0"):
        torch.empty(2, device="tpu:1")
    with pytest.raises(RuntimeError, match="binds each process to device tpu:0"):
        torch.tpu.device(1)
    with pytest.raises(NotImplementedError, match="getNewGenerator"):
        torch.Generator("tpu")
    with pytest.raises(RuntimeError, match="cannot resize a 'tpu' storage of 12 bytes to 64 bytes"):
        x.untyped_storage().resize_(64)
    with pytest.raises(RuntimeError, match="byte count only"):
        torch.UntypedStorage([1, 2], device="tpu")
    assert torch.equal(x.to("cpu", non_blocking=True), torch.ones(3))  # no pinned memory needed
