"""NVIDIA's own stack as the GPU peer: RE-USE in PyTorch with mamba_ssm's fused Mamba modules.

This is what a researcher with an NVIDIA GPU runs: the RE-USE network of torch_peer.py with
``mamba_ssm.modules.mamba_simple.Mamba(d_model, d_state=16, d_conv=4, expand=4)`` in every Mamba
position. Under ``torch.inference_mode()`` and without ``inference_params`` its forward takes the
fused path (``mamba_inner_fn``: the ``causal_conv1d_cuda`` conv + SiLU, the
``selective_scan_cuda`` scan with softplus, D skip and SiLU(z) gate fused, cuBLAS projections).
The state dict is the same official-layout checkpoint speechlens loads: mamba_ssm's Mamba has
exactly RE-USE's nine tensors per module.

Runs in a process of its own, as peer_process.py does and for its reasons (torch loads its CUDA
libraries before MLX loads its own; the peer's memory stays out of speechlens's process), from
the command line of runner.peer_argv; its one argument is a JSON object:

    weights, config   the checkpoint (model.safetensors, config.json)
    cases             list of {"src": input .npy (float32 [N]) or .wav, "rate": Hz, "label": str,
                      "dst": where the enhanced float32 [N] .npy goes (optional),
                      "warmup"/"trials": this case's own repeats (optional)}
    tf32              "default" (torch's own settings: cuDNN convolutions in TF32, matmuls not)
                      or "off" (full float32 everywhere, the same arithmetic as speechlens)
    warmup, trials    untimed and timed runs per case (default 3 and 10)
    device            torch's device (default "cuda")
    factory           "module:function" building each Mamba in place of mamba_ssm's (tests)

Each case is the whole file as one window (like NVIDIA's inference script). A trial is timed from
the NumPy input to the NumPy output (host-to-device copy, STFT, generator, iSTFT, copy back),
with torch.cuda.synchronize() on both sides; the result has every trial and the median.
Peak memory is torch.cuda.max_memory_allocated() over the case's warm-ups and trials (weights
included), with max_memory_reserved() beside it. Prints one JSON line on stdout, progress on
stderr. Needs CUDA and mamba_ssm with its CUDA extensions (mamba_ssm cannot run elsewhere: on the
CPU or Apple GPUs the plain-loop peer, peer_process.py, is the one to run).
"""

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import torch_peer

PEER_NAME = ("NVIDIA stack (PyTorch + mamba_ssm): fused causal_conv1d + selective_scan CUDA "
             "kernels, RE-USE model of speechlens_cli/bench/torch_peer.py with "
             "mamba_ssm.modules.mamba_simple.Mamba in every Mamba position")


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def mamba_ssm_module(d: int, d_state: int, d_conv: int, expand: int) -> torch.nn.Module:
    """mamba_ssm's Mamba with RE-USE's sizes (same nine tensors as torch_peer.Mamba)."""
    from mamba_ssm.modules.mamba_simple import Mamba

    return Mamba(d_model=d, d_state=d_state, d_conv=d_conv, expand=expand)


def load_nvidia_peer(weights, config=None, device="cuda", factory=mamba_ssm_module):
    model = torch_peer.load_peer(weights, config, device, mamba=factory)
    mambas = [m for m in model.modules() if type(m).__name__ == "Mamba"]
    return model, mambas


def set_tf32(mode: str) -> dict:
    """Apply `mode` ("default" leaves torch's settings alone) and return what is in force."""
    if mode == "off":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif mode != "default":
        raise ValueError(f"tf32 must be 'default' or 'off', got {mode!r}")
    return {"tf32_mode": mode,
            "cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def _read_audio(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        audio = np.load(path)
    else:
        import soundfile as sf

        audio, _ = sf.read(str(path), dtype="float32", always_2d=True)
        audio = audio[:, 0]
    return np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_case(model, audio: np.ndarray, rate: int, device: str, warmup: int, trials: int,
             label: str) -> tuple[dict, np.ndarray]:
    cuda = torch.device(device).type == "cuda"

    def once() -> np.ndarray:
        x = torch.from_numpy(audio)[None].to(device)
        return model.enhance(x, rate)[0].cpu().numpy()

    if cuda:
        _sync(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = int(torch.cuda.memory_allocated())
    out = None
    for i in range(warmup):
        _sync(device)
        t0 = time.perf_counter()
        out = once()
        _log(f"  {label}: warm-up {i + 1}/{warmup} {time.perf_counter() - t0:.4f} s")
    times = []
    for i in range(trials):
        _sync(device)
        t0 = time.perf_counter()
        out = once()
        _sync(device)
        times.append(time.perf_counter() - t0)
        _log(f"  {label}: trial {i + 1}/{trials} {times[-1]:.4f} s")
    result = {"label": label, "rate": rate, "samples": int(audio.size),
              "seconds": audio.size / rate, "warmup": warmup, "trials": trials,
              "times_s": times, "median_s": statistics.median(times), "min_s": min(times)}
    if cuda:
        result["allocated_before_bytes"] = before
        result["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        result["max_memory_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
    return result, out


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    device = args.get("device", "cuda")
    settings = set_tf32(args.get("tf32", "default"))
    warmup, trials = int(args.get("warmup", 3)), int(args.get("trials", 10))
    t0 = time.perf_counter()
    factory = _factory(args["factory"]) if args.get("factory") else mamba_ssm_module
    model, mambas = load_nvidia_peer(args["weights"], args.get("config"), device, factory)
    load_s = time.perf_counter() - t0
    info = {"peer": PEER_NAME, "torch": torch.__version__, "device": device,
            "fused_path": _fused_path_available(mambas),
            "mamba_modules": len(mambas),
            "mamba_module_class": f"{type(mambas[0]).__module__}.{type(mambas[0]).__name__}"
            if mambas else None, **settings}
    try:
        import mamba_ssm

        info["mamba_ssm"] = getattr(mamba_ssm, "__version__", "?")
    except ImportError:
        pass
    if torch.device(device).type == "cuda":
        info.update({"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version()})
    cases = []
    for case in args["cases"]:
        audio = _read_audio(Path(case["src"]))
        label = f"{case.get('label', Path(case['src']).stem)} tf32={settings['tf32_mode']}"
        result, out = run_case(model, audio, int(case["rate"]), device,
                               int(case.get("warmup", warmup)), int(case.get("trials", trials)),
                               label)
        if case.get("dst"):
            np.save(case["dst"], out.astype(np.float32))
            result["dst"] = case["dst"]
        _log(f"{label}: median {result['median_s']:.4f} s, peak "
             f"{result.get('max_memory_allocated_bytes', 0) / 2**30:.2f} GiB")
        cases.append(result)
    print(json.dumps({"info": info, "load_s": load_s, "cases": cases}), flush=True)
    return 0


def _fused_path_available(mambas) -> bool:
    """Whether mamba_ssm's Mamba.forward will take mamba_inner_fn (the fused CUDA kernels)."""
    try:
        from mamba_ssm.modules import mamba_simple
    except ImportError:
        return False
    return (mamba_simple.causal_conv1d_fn is not None
            and all(getattr(m, "use_fast_path", False) for m in mambas))


def _factory(spec: str):
    """'module:function' building a Mamba from (d, d_state, d_conv, expand) (tests)."""
    import importlib

    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
