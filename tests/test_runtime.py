"""Runtime resolution: explicit decisions, profile defaults per device, clear errors, the device report."""

from __future__ import annotations

import pytest
import torch

from gptcore.config import DeviceDefaults, RuntimeConfig, load_profile
from gptcore.errors import DeviceError
from gptcore.runtime import device as rt

PROFILE = load_profile("gpt_first_cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: auto resolves to cuda")
def test_auto_on_this_machine_takes_the_cpu_defaults_of_the_profile() -> None:
    runtime = rt.resolve_runtime(RuntimeConfig(), PROFILE)
    assert runtime.device == "cpu"
    assert (runtime.batch_size, runtime.grad_accum_steps, runtime.precision, runtime.workers) == (
        8,
        1,
        "fp32",
        0,
    )
    assert runtime.precision_source.startswith("auto")
    assert not runtime.tf32_enabled and not runtime.pin_memory and not runtime.tensor_cores_enabled


def test_requests_win_over_defaults_and_a_callable_source_is_used() -> None:
    seen = []

    def defaults_for(device: str) -> DeviceDefaults:
        seen.append(device)
        return DeviceDefaults(batch_size=3, grad_accum_steps=5, precision="fp32", workers=1)

    request = RuntimeConfig(device="cpu", precision="bf16", batch_size=2, workers=0)
    runtime = rt.resolve_runtime(request, defaults_for)
    assert seen == ["cpu"]
    assert (runtime.batch_size, runtime.grad_accum_steps, runtime.workers) == (2, 5, 0)
    assert runtime.precision == "bf16" and runtime.precision_source == "requested"
    assert runtime.dtype is torch.bfloat16


def test_parameter_file_device_defaults_override_the_profile() -> None:
    request = RuntimeConfig(device="cpu", cpu=DeviceDefaults(batch_size=4, precision="bf16"))
    runtime = rt.resolve_runtime(request, PROFILE)
    assert (runtime.batch_size, runtime.precision) == (4, "bf16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_an_error_saying_what_to_do() -> None:
    with pytest.raises(DeviceError) as caught:
        rt.resolve_runtime(RuntimeConfig(device="cuda"), PROFILE)
    message = str(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in message
    assert "CUDA is not available" in message and "--device cpu" in message


def _pretend_gpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Old GPU")
    monkeypatch.setattr(rt, "fused_adamw_supported", lambda device: False)


def test_bf16_requested_on_a_gpu_without_it_names_the_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_gpu_without_bf16(monkeypatch)
    with pytest.raises(DeviceError, match=r"--precision fp16.*--precision fp32"):
        rt.resolve_runtime(RuntimeConfig(device="cuda", precision="bf16"), PROFILE)


def test_auto_precision_on_a_gpu_without_bf16_takes_fp16_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_gpu_without_bf16(monkeypatch)
    runtime = rt.resolve_runtime(RuntimeConfig(device="cuda"), PROFILE)
    assert runtime.device == "cuda" and runtime.precision == "fp16" and runtime.uses_grad_scaler
    assert "unsupported" in runtime.precision_source
    assert runtime.tf32_enabled and runtime.pin_memory and runtime.tensor_cores_enabled
    assert runtime.batch_size == PROFILE.gpu.batch_size


def test_fused_adamw_is_reported_as_found_not_assumed(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils._foreach_utils as foreach_utils

    rt.fused_adamw_supported.cache_clear()
    monkeypatch.setattr(foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cuda"])
    try:
        assert rt.fused_adamw_supported("cpu") is False
        assert rt.fused_adamw_supported("cuda") is True
    finally:
        rt.fused_adamw_supported.cache_clear()


def test_without_torchs_device_table_one_real_fused_step_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("fused=True requires CUDA")

    assert rt._fused_adamw_step_runs("cpu") is True  # torch 2.13 runs fused AdamW on the CPU
    monkeypatch.setattr(torch.optim, "AdamW", refuse)
    assert rt._fused_adamw_step_runs("cpu") is False


def test_device_report_holds_the_environment_facts() -> None:
    report = rt.device_report("cpu")
    for key in (
        "torch_version",
        "cuda_available",
        "device",
        "gpu_name",
        "gpu_memory_bytes",
        "bf16_supported",
        "tf32_supported",
        "fused_adamw_supported",
        "processor",
    ):
        assert key in report
    assert report["device"] == "cpu" and report["torch_version"] == torch.__version__


def test_autocast_is_off_in_fp32_and_bf16_on_cpu_when_asked() -> None:
    fp32 = rt.resolve_runtime(RuntimeConfig(device="cpu", precision="fp32"), PROFILE)
    bf16 = rt.resolve_runtime(RuntimeConfig(device="cpu", precision="bf16"), PROFILE)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with fp32.autocast():
        assert (a @ b).dtype is torch.float32
    with bf16.autocast():
        assert (a @ b).dtype is torch.bfloat16


def _backends(monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _backends(monkeypatch, cuda=True, mps=True)
    assert rt.resolve_device("auto") == "cuda" and rt.resolve_device("mps") == "mps"
    _backends(monkeypatch, cuda=False, mps=True)
    assert rt.resolve_device("auto") == "mps" and rt.resolve_device("cpu") == "cpu"
    _backends(monkeypatch, cuda=False, mps=False)
    assert rt.resolve_device("auto") == "cpu"


def test_mps_where_torch_has_none_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _backends(monkeypatch, cuda=True, mps=False)  # a GPU of another kind does not stand in for it
    with pytest.raises(DeviceError) as caught:
        rt.resolve_device("mps")
    message = str(caught.value)
    assert message.startswith("--device mps: Apple's Metal (MPS) backend is not available here")
    assert "--device cpu or auto" in message and "\n" not in message


def test_mps_takes_the_profiles_gpu_defaults_and_bf16_only_from_macos_14(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _backends(monkeypatch, cuda=False, mps=True)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: major <= 14)
    runtime = rt.resolve_runtime(RuntimeConfig(device="mps"), PROFILE)
    assert (runtime.device, runtime.batch_size, runtime.precision) == ("mps", PROFILE.gpu.batch_size, "bf16")
    assert not runtime.pin_memory and not runtime.tf32_enabled
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: major <= 13)
    older = rt.resolve_runtime(RuntimeConfig(device="mps"), PROFILE)
    assert older.precision == "fp32" and "macOS 14" in older.precision_source
    with pytest.raises(DeviceError, match="--precision bf16: this GPU \\(MPS before macOS 14\\)"):
        rt.resolve_runtime(RuntimeConfig(device="mps", precision="bf16"), PROFILE)
