"""The device a command computes on, checked before any work: a name PyTorch does not know, a device type this
machine lacks, or an index beyond its devices is refused in one line naming the option, rather than failing inside
PyTorch once a model has loaded."""

import torch

from .errors import CommandError


def default_device() -> str:
    """cuda when this machine has a CUDA device, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _available(kind: str) -> tuple[bool, int | None]:
    """Whether this machine has devices of type `kind`, and how many (None: not counted)."""
    if kind == "mps":
        return torch.backends.mps.is_available(), None
    module = getattr(torch, kind, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available):
        return False, None
    available = bool(is_available())
    count = getattr(module, "device_count", None)
    return available, count() if available and callable(count) else None


def resolve_device(text: str | None, option: str = "--device") -> str:
    """The device `text` names (None: `default_device`), once checked: PyTorch knows the name, this machine has a
    device of that type, and of that index. The meta device, which holds no values, is refused."""
    if text is None:
        return default_device()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise CommandError(f"{option} {text!r} is not a device PyTorch knows (e.g. cpu, cuda, cuda:1, mps)") from None
    if device.type == "meta":
        raise CommandError(f"{option} {text}: the meta device holds no values to compute with; give cpu, cuda, ...")
    if device.type == "cpu":
        return text
    available, count = _available(device.type)
    if not available:
        raise CommandError(f"{option} {text}: this machine has no {device.type} device (PyTorch {torch.__version__} "
                           f"finds none); give cpu, or a device it has")  # fmt: skip
    if device.index is not None and count is not None and device.index >= count:
        raise CommandError(f"{option} {text}: this machine has {count} {device.type} device(s), "
                           f"{device.type}:0 to {device.type}:{count - 1}")  # fmt: skip
    return text
