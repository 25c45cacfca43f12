"""The machine a benchmark runs on, as data: its CPU, GPU and platform, and the versions that run there (python,
torch, timm, torchvision, visionpe's commit or version), which every benchmark's results record name."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path


def visionpe_version() -> str:
    """The visionpe that runs: ``git <commit>`` (``+ local changes`` when the checkout differs from it) when the
    package is imported from a git checkout, else ``<version>`` of the installed package."""
    import visionpe
    root = Path(visionpe.__file__).resolve().parent.parent
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30)
    try:
        top, head = git("rev-parse", "--show-toplevel"), git("rev-parse", "--short=12", "HEAD")
    except (OSError, subprocess.SubprocessError):
        top = head = None
    if top is None or top.returncode or head.returncode or Path(top.stdout.strip()).resolve() != root:
        return visionpe.__version__
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "visionpe").stdout.strip()
    return f"git {head.stdout.strip()}" + (" + local changes" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``), or the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def environment() -> dict:
    """This machine and the versions that run here: CPU model and core count, the CUDA GPU's name (None without
    one), platform, python, torch (and its CUDA), timm, torchvision, visionpe (:func:`visionpe_version`)."""
    import timm
    import torch
    import torchvision
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpu": gpu, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "timm": timm.__version__, "torchvision": torchvision.__version__, "visionpe": visionpe_version()}


def resolved_device(device: str) -> str:
    """``cuda`` or ``cpu``: where a ``device`` setting (``auto``, ``cpu``, ``cuda``) runs on this machine."""
    import torch
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"


def machine_text(made: dict, cpu: str | None = None) -> str:
    """A machine of a record (``made``: :func:`environment` and the ``device`` measured) in one line for a report:
    the GPU on CUDA, else ``cpu`` (default: the CPU model and its core count), then the platform and the versions."""
    on_gpu = made["device"] == "cuda" and made.get("gpu")
    device = made["gpu"] if on_gpu else cpu or f"{made['cpu']}, {made['cpu_count']} cores"
    cuda = f" (CUDA {made['cuda']})" if on_gpu else ""
    return (f"{device}; {made['platform']}; python {made['python']}, torch {made['torch']}{cuda}, "
            f"timm {made['timm']}, visionpe {made['visionpe']}")
