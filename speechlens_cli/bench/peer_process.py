"""Runs the PyTorch peer's timed trials in a process of its own (started by runner.py).

The process runs the command line of runner.peer_argv, which imports torch before this package:
torch must load its CUDA libraries before MLX loads its own. In one process with MLX first,
torch finds MLX's older cuDNN already loaded and refuses to run ("cuDNN version
incompatibility", seen on the H200). A process of its own also keeps the peer's memory out of
speechlens's RSS and vice versa.

Its one argument is a JSON object; it prints one JSON result line on stdout, progress on
stderr.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from .. import settings
from . import cases, runner, torch_peer


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    # The same arithmetic as speechlens: full float32 unless MLX_ENABLE_TF32=1 (speechlens sets
    # it to 0 by default). torch's cuDNN convolutions use TF32 by default, which alone moved the
    # peer's waveform by 3e-3 relative RMSE on the H200.
    tf32 = settings.TF32.value()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32

    device = args["device"]
    if device == "auto":
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    t0 = time.perf_counter()
    model = torch_peer.load_peer(args["weights"], args["config"], device)
    load_s = time.perf_counter() - t0
    rate = args["rate"]

    def window_fn(window: np.ndarray) -> np.ndarray:
        out = np.empty(window.shape, np.float32)
        for channel in range(window.shape[1]):
            x = torch.from_numpy(np.ascontiguousarray(window[:, channel]))[None].to(device)
            out[:, channel] = model.enhance(x, rate)[0].cpu().numpy()
        return out

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    rss_before = runner.rss_now()
    runner.reset_rss_peak()
    def one_file(src: Path, dst: Path, window_s: float) -> int:
        return runner.stream(src, dst, window_fn, rate, window_s, args["overlap"])

    def each_file() -> int:
        """A corpus (bench --corpus): every file as one window, in one loop."""
        return sum(one_file(Path(f["src"]), Path(f["dst"]), sf.info(f["src"]).duration)
                   for f in args["files"])

    run = each_file if "files" in args else (
        lambda: one_file(Path(args["src"]), Path(args["dst"]), args["window"]))
    timing = runner.time_runs(run, args["warmup"], args["trials"], args["budget_s"], log,
                              args["label"])
    info = {cases.PLAIN_PEER: (f"PyTorch {torch.__version__} on {torch_peer.device_name(device)}, "
                               "in a "
                     "process of its own; speechlens_cli/bench/torch_peer.py: per-step Python "
                     "loop selective scan, float32")}
    if device == "cuda":
        info[f"{cases.PLAIN_PEER}, CUDA"] = (f"CUDA {torch.version.cuda}, cuDNN "
                             f"{torch.backends.cudnn.version()}, TF32 {'on' if tf32 else 'off'} "
                             "(as speechlens: MLX_ENABLE_TF32)")
    result = {"device": device, "load_s": load_s, "info": info,
              "warmup": timing.warmup, "trials_planned": timing.trials_planned,
              "times_s": timing.times_s, "note": timing.note, "rss_before_bytes": rss_before,
              "rss_peak_bytes": runner.rss_peak(),
              "torch_peak_bytes": (int(torch.cuda.max_memory_allocated())
                                   if device == "cuda" else None)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
