"""Runtime resolution: explicit decisions, profile defaults per device, clear errors, the device report."""

from __future__ import annotations

import math

import pytest
import torch

from gptcore.errors import DeviceError
from gptcore.runtime import device as rt
from gptcore.runtime import precision_speed
from gptcore.runtime.config import DeviceDefaults, RuntimeConfig
from gptcore.runtime.precision_speed import PrecisionSpeed, PrecisionSpeeds
from tasks.params.loading import load_profile

PROFILE = load_profile("gpt_first_cpu")


def probe_result(
    device: str, train: float, decode: float = 2.0, native: bool | None = None
) -> PrecisionSpeeds:
    """A precision probe's result as a device might give it: both 16-bit types at these ratios to fp32."""
    return PrecisionSpeeds(
        device, tuple(PrecisionSpeed(p, device, train, decode, native) for p in ("bf16", "fp16"))
    )


@pytest.fixture(autouse=True)
def sixteen_bit_pays(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The precision probe stubbed: 16-bit trains at twice fp32's speed on any device (as on a GPU or a
    CPU with AVX512-BF16); a test wanting an emulating CPU says so. Never this machine's speed."""
    probed: list[str] = []

    def measure(device: str) -> PrecisionSpeeds:
        probed.append(device)
        return probe_result(device, 2.0)

    monkeypatch.setattr(rt, "measure_precision_speeds", measure)
    return probed


def an_emulating_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe as on an AVX2-only CPU: 16-bit training-shaped matmuls at 0.15x fp32, decode at 2.5x."""
    monkeypatch.setattr(rt, "measure_precision_speeds", lambda device: probe_result(device, 0.15, 2.5, False))


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


def test_auto_never_takes_a_16_bit_default_that_trains_slower_than_fp32_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    an_emulating_cpu(monkeypatch)
    request = RuntimeConfig(device="cpu", cpu=DeviceDefaults(batch_size=4, precision="bf16"))
    runtime = rt.resolve_runtime(request, PROFILE)
    assert runtime.precision == "fp32" and runtime.precision_warning is None
    assert runtime.precision_source == (
        "auto: profile default bf16 trains at 0.15x fp32's speed on this cpu (measured), fp32"
    )


def test_auto_decides_by_the_probe_it_is_given_not_by_measuring_again(sixteen_bit_pays: list[str]) -> None:
    request = RuntimeConfig(device="cpu", cpu=DeviceDefaults(batch_size=4, precision="bf16"))
    assert rt.resolve_runtime(request, PROFILE, probe_result("cpu", 0.5)).precision == "fp32"
    assert rt.resolve_runtime(request, PROFILE, probe_result("cpu", 1.3)).precision == "bf16"
    assert sixteen_bit_pays == []
    assert rt.resolve_runtime(RuntimeConfig(device="cpu"), PROFILE).precision == "fp32"
    assert sixteen_bit_pays == []  # an fp32 default is never probed


def test_an_explicit_precision_slower_than_fp32_is_kept_with_one_warning_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    an_emulating_cpu(monkeypatch)
    runtime = rt.resolve_runtime(RuntimeConfig(device="cpu", precision="bf16"), PROFILE)
    assert (runtime.precision, runtime.precision_source) == ("bf16", "requested")
    assert runtime.precision_warning == (
        "--precision bf16: bf16 on cpu: training-shaped matmuls 0.15x fp32's speed, decode-shaped 2.50x "
        "(emulated: this CPU has no avx512_bf16 or amx_bf16); training will be slower than in fp32 "
        "(runtime.precision auto would take fp32 here)"
    )
    fp32 = rt.resolve_runtime(RuntimeConfig(device="cpu", precision="fp32"), PROFILE)
    assert fp32.precision_warning is None


def test_an_explicit_precision_that_pays_has_no_warning() -> None:
    bf16 = rt.resolve_runtime(RuntimeConfig(device="cpu", precision="bf16"), PROFILE)
    assert bf16.precision_warning is None


def test_the_device_report_carries_the_ratios_the_probe_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe over scripted timings, as on an AVX2-only CPU: a 16-bit training-shaped matmul
    takes 1/0.15 of fp32's time, a decode-shaped one 0.4 of it; the report's ratios come out of them."""
    uncached = precision_speed.measure_precision_speeds.__wrapped__  # nothing scripted kept for others
    monkeypatch.setattr(rt, "measure_precision_speeds", uncached)
    monkeypatch.setattr(precision_speed, "cpu_native", lambda precision: False)

    def timed(device: str, a: torch.Tensor, b: torch.Tensor) -> float:
        decode = a.shape[0] == 1  # one row: the decode shape
        if a.dtype == torch.float32:
            return 1.0
        return 0.4 if decode else 1.0 / 0.15

    monkeypatch.setattr(precision_speed, "_timed", timed)
    report = rt.device_report("cpu")
    printed = report.to_dict()  # as `gptpipe device --json` prints it
    assert printed["bf16_train_speedup"] == pytest.approx(0.15)
    assert printed["fp16_decode_speedup"] == pytest.approx(2.5)
    assert printed["bf16_emulated"] and printed["fp16_emulated"]
    assert PrecisionSpeeds.from_dict(printed["precision_speeds"]) == report.precision_speeds
    assert "precision_speeds" not in rt.device_report("cpu", precision_speeds=False).to_dict()


def test_the_probe_times_a_slow_precision_once_and_a_fast_one_until_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs: list[float] = []

    def timed(seconds: float):  # a matmul that "takes" `seconds`, whatever this machine's speed
        def run(device: str, a: torch.Tensor, b: torch.Tensor) -> float:
            runs.append(seconds)
            return seconds

        return run

    monkeypatch.setattr(precision_speed, "_timed", timed(5.0))
    assert precision_speed._flops("cpu", "bf16", (2, 2, 2)) == pytest.approx(16 / 5.0)
    assert len(runs) == 1  # slower than the budget: its one run is its measure
    runs.clear()
    monkeypatch.setattr(precision_speed, "_timed", timed(1e-4))
    precision_speed._flops("cpu", "fp32", (2, 2, 2), seconds=0.01)
    assert len(runs) >= 4  # the first, then at least three more


def test_the_real_probe_divides_each_16_bit_types_best_time_by_fp32s_on_real_matmuls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real matmuls timed on this machine, whatever its speed: each ratio is fp32's best time over the
    16-bit type's best, each shape timed in the dtype it names."""
    best: dict[tuple[torch.dtype, int], float] = {}
    real = precision_speed._timed

    def recorded(device: str, a: torch.Tensor, b: torch.Tensor) -> float:
        assert a.dtype == b.dtype
        seconds = real(device, a, b)
        key = (a.dtype, a.shape[0])
        best[key] = min(best.get(key, math.inf), seconds)
        return seconds

    monkeypatch.setattr(precision_speed, "_timed", recorded)
    speeds = precision_speed.measure_precision_speeds.__wrapped__("cpu")  # measured here, not a cached one
    (train_rows, _, _), (decode_rows, _, _) = precision_speed.SHAPES["cpu"]
    assert {dtype for dtype, _ in best} == {torch.float32, torch.bfloat16, torch.float16}
    for speed in speeds.speeds:
        dtype = precision_speed.DTYPES[speed.precision]
        train = best[torch.float32, train_rows] / best[dtype, train_rows]
        decode = best[torch.float32, decode_rows] / best[dtype, decode_rows]
        assert (speed.train_speedup, speed.decode_speedup) == (pytest.approx(train), pytest.approx(decode))
        assert speed.native == precision_speed.cpu_native(speed.precision)
    assert set(speeds.figures()) == {
        "bf16_train_speedup",
        "bf16_decode_speedup",
        "fp16_train_speedup",
        "fp16_decode_speedup",
    }


def test_a_cpu_is_native_for_a_precision_only_where_its_flags_say_so(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert precision_speed.cpu_native("bf16", cpuinfo) is True
    assert precision_speed.cpu_native("fp16", cpuinfo) is False
    assert precision_speed.cpu_native("bf16", tmp_path / "absent") is None


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
    report = rt.device_report("cpu").to_dict()
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


def test_the_peak_probes_products_stay_bounded_whatever_the_batch() -> None:
    from gptcore.runtime.flops import PROBE_FLOPS, model_matmul_shapes

    big = load_profile("gpt_100m").architecture
    shapes = model_matmul_shapes(big, 2048 * big.block_size)  # the dry-run test's batch: 2M tokens
    assert all(2 * m * k * n <= PROBE_FLOPS for m, k, n in shapes)
    assert shapes[0] == (682, 768, 16384)  # the head: its rows cut, its vocabulary whole
    first = PROFILE.architecture
    assert model_matmul_shapes(first, 8 * first.block_size)[0] == (2048, 256, 8192)  # iteration 1's whole
