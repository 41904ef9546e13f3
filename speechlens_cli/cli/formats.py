"""`speechlens formats`: what this installation reads and writes, by file suffix."""

from __future__ import annotations

import click

from .. import audio as audio_io
from .app import main


@main.command("formats")
def formats() -> None:
    """List the file formats speechlens reads and writes here, with their encodings."""
    click.echo("Output suffix   container  encodings it can be written with (--subtype)")
    for suffix in audio_io.writable_suffixes():
        fmt = audio_io.format_for_suffix(suffix)
        click.echo(f"{suffix:<15} {fmt:<10} {' '.join(audio_io.container_subtypes(fmt))}")
    click.echo("\nRead: all of the above, and any audio track FFmpeg decodes in them (Vorbis, "
               "AC-3, PCM in MOV...).\nOutputs keep the input's container and encoding; "
               "another suffix asks for another container, and an encoding it cannot hold\n"
               "becomes the nearest lossless one it has (announced in a note).")
