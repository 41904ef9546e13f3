"""The official checkpoint layout (PyTorch names and shapes), derived from a ModelConfig."""

from __future__ import annotations

from .config import ModelConfig


def _cna(prefix: str, c_in: int, c_out: int, kh: int, kw: int) -> dict[str, tuple[int, ...]]:
    """Conv2d -> InstanceNorm2d(affine) -> PReLU(per channel), as `prefix.{0,1,2}`."""
    return {
        f"{prefix}.0.weight": (c_out, c_in, kh, kw),
        f"{prefix}.0.bias": (c_out,),
        f"{prefix}.1.weight": (c_out,),
        f"{prefix}.1.bias": (c_out,),
        f"{prefix}.2.weight": (c_out,),
    }


def _dense_block(prefix: str, ch: int, depth: int = 4) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(depth):
        shapes |= _cna(f"{prefix}.dense_block.{i}", ch * (i + 1), ch, 3, 3)
    return shapes


def _up_conv(prefix: str, ch: int, ratio: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.0.conv.weight": (ch * ratio, ch, 1, 3),
        f"{prefix}.0.conv.bias": (ch * ratio,),
        f"{prefix}.1.weight": (ch,),
        f"{prefix}.1.bias": (ch,),
        f"{prefix}.2.weight": (ch,),
    }


def _mamba(prefix: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, di, n, r = cfg.hid_feature, cfg.d_inner, cfg.d_state, cfg.dt_rank
    return {
        f"{prefix}.in_proj.weight": (2 * di, d),
        f"{prefix}.conv1d.weight": (di, 1, cfg.d_conv),
        f"{prefix}.conv1d.bias": (di,),
        f"{prefix}.x_proj.weight": (r + 2 * n, di),
        f"{prefix}.dt_proj.weight": (di, r),
        f"{prefix}.dt_proj.bias": (di,),
        f"{prefix}.A_log": (di, n),
        f"{prefix}.D": (di,),
        f"{prefix}.out_proj.weight": (d, di),
    }


def _bimamba(prefix: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d = cfg.hid_feature
    return (
        _mamba(f"{prefix}.forward_blocks", cfg)
        | _mamba(f"{prefix}.backward_blocks", cfg)
        | {
            f"{prefix}.output_proj.weight": (d, 2 * d),
            f"{prefix}.output_proj.bias": (d,),
            f"{prefix}.norm.weight": (d,),
            f"{prefix}.norm.bias": (d,),
        }
    )


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the official checkpoint, in PyTorch layout, in a stable order."""
    ch = cfg.hid_feature
    shapes = _cna("dense_encoder.dense_conv_1", cfg.input_channel, ch, 1, 1)
    shapes |= _dense_block("dense_encoder.dense_block", ch)
    shapes |= _cna("dense_encoder.dense_conv_2", ch, ch, 1, 3)
    for i in range(cfg.num_tfmamba):
        shapes |= _bimamba(f"TSMamba.{i}.time_mamba", cfg)
        shapes |= _bimamba(f"TSMamba.{i}.freq_mamba", cfg)
    for name, heads in (("mask_decoder", ("final_conv",)),
                        ("phase_decoder", ("phase_conv_r", "phase_conv_i"))):
        shapes |= _dense_block(f"{name}.dense_block", ch)
        shapes |= _up_conv(f"{name}.up_conv1", ch, 2)
        shapes |= _up_conv(f"{name}.up_conv2", ch, 4)
        for head in heads:
            shapes[f"{name}.{head}.weight"] = (cfg.output_channel, ch, 1, 1)
            shapes[f"{name}.{head}.bias"] = (cfg.output_channel,)
    return shapes
