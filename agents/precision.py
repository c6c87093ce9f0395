"""Training precision: whether this machine computes bf16 natively, and the TrainingArguments / TRL
config fields for a precision. Used by the examples and the benchmarks (TRL's configs default to
bf16, which an AVX2-only CPU emulates at ~8x the cost of fp32)."""

from __future__ import annotations

__all__ = ["cpu_flags", "native_precision", "precision_args"]

# The CPU features that decide whether bf16 is native (and a few that say what kind of CPU it is).
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx_vnni", "avx512_vnni")


def cpu_flags() -> list[str]:
    """The CPU's SIMD flags from /proc/cpuinfo that matter for training precision (Linux)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [f for f in _FLAGS if f in present]
    except OSError:
        pass
    return []


def native_precision() -> str:
    """``"bf16"`` where the machine computes bf16 natively (a GPU that supports it; a CPU with
    AVX512-BF16 or AMX), else ``"fp32"``. Elsewhere bf16 autocast is emulated: on an AVX2-only CPU a
    SmolLM2 DPO step took ~8x as long as in fp32 (TRL's configs default to bf16)."""
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if (native is not None and native()) or {"avx512_bf16", "amx_bf16"} & set(cpu_flags()):
        return "bf16"
    return "fp32"


def precision_args(precision: str | None = None) -> dict[str, bool]:
    """TrainingArguments / TRL config fields for ``precision`` (default: :func:`native_precision`);
    both set explicitly, since TRL's configs turn bf16 on when left unset."""
    precision = precision or native_precision()
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
    return {"bf16": precision == "bf16", "fp16": False}
