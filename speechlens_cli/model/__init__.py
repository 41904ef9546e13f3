"""The RE-USE model in MLX: config, checkpoint layout, STFT, encoder/decoders, Mamba blocks."""
