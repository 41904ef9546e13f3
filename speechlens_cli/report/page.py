"""The HTML of a file's page and of a batch's summary: one file each, every picture and sound
inside it as a data: URI, so a page opens offline, from a mail attachment as from a disk."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from .excerpt import Excerpt
from .scores import KEYS, ScoreChange

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 62em; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.4em; word-break: break-all; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { padding: .25em .8em; text-align: right; }
th:first-child, td:first-child { text-align: left; } thead th { border-bottom: 1px solid #999; }
.better { color: #1a7f37; } .worse { color: #c62828; font-weight: 600; }
.players { display: grid; grid-template-columns: max-content 1fr; gap: .5em 1em;
           align-items: center; } audio { width: 100%; }
img { max-width: 100%; height: auto; } .note { color: #555; font-size: .92em; }
"""
DNSMOS_NOTE = ("DNSMOS (Microsoft, DNS Challenge): P.835 SIG (the speech), BAK (the background), "
               "OVRL (overall) and P.808 MOS, each from 1 (bad) to 5, computed on the whole file "
               "as 16 kHz mono; no clean reference is needed.")


def _document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _shown(value: float) -> float:
    """A change as the pages show it, to 0.01: what shows as 0 is no change (never -0.00)."""
    return round(value, 2) + 0.0


def _signed(value: float) -> str:
    shown = _shown(value)
    kind = "better" if shown > 0 else "worse" if shown < 0 else ""
    return f'<span class="{kind}">{shown:+.2f}</span>'


@dataclass(frozen=True)
class FileView:
    """What a file's page shows, gathered by the caller: its names, scores and excerpt, and the
    excerpt's sounds and pictures already encoded as data: URIs."""

    name: str
    output_name: str
    change: ScoreChange
    excerpt: Excerpt
    sounds: dict[str, str]   # label -> MP3 data: URI
    spectrograms: str        # JPEG data: URI


def file_page(view: FileView) -> str:
    change, excerpt = view.change, view.excerpt
    rows = "".join(f"<tr><td>{key.upper()}</td><td>{getattr(change.input, key):.2f}</td>"
                   f"<td>{getattr(change.output, key):.2f}</td>"
                   f"<td>{_signed(getattr(change.change, key))}</td></tr>" for key in KEYS)
    players = "".join(f"<div>{escape(label)}</div><audio controls preload=\"metadata\" "
                      f'src="{uri}"></audio>' for label, uri in view.sounds.items())
    heard = (f"the first {excerpt.excerpt_seconds:.0f} s of {excerpt.seconds:.1f} s"
             if excerpt.is_cut else f"the whole file ({excerpt.seconds:.1f} s)")
    mixed = f", its {excerpt.channels} channels mixed to mono" if excerpt.channels > 1 else ""
    converted = (f" The scores read it {escape(change.converted)}."
                 if change.converted else "")
    output = ("its standard output" if view.output_name == "-"
              else f"<code>{escape(view.output_name)}</code>")
    body = f"""<h1>{escape(view.name)}</h1>
<p>Enhanced by speechlens into {output}.</p>
<h2>Scores</h2>
<table><thead><tr><th>DNSMOS</th><th>input</th><th>output</th><th>change</th></tr></thead>
<tbody>{rows}</tbody></table>
<p class="note">{DNSMOS_NOTE}{converted}</p>
<h2>Listen</h2>
<div class="players">{players}</div>
<p class="note">The players and pictures hold {heard}{mixed}, as MP3 at the file's rate
(up to 48 kHz); the scores cover the whole file.</p>
<h2>Spectrograms</h2>
<img alt="spectrograms of the input, the output and the removed part" src="{view.spectrograms}">
"""
    return _document(f"speechlens: {view.name}", body)


@dataclass(frozen=True)
class SummaryEntry:
    name: str
    link: str   # the file's page, relative to the summary
    change: ScoreChange


def summary_page(entries: list[SummaryEntry], histograms: str | None, unscored: int) -> str:
    """The batch on one page: how the scores moved, then every file, those whose OVRL dropped
    first (the worst at the top), each linking to its page."""
    ordered = sorted(entries, key=lambda entry: entry.change.change.ovrl)
    worse = sum(_shown(entry.change.change.ovrl) < 0 for entry in entries)
    rows = "".join(
        f'<tr><td><a href="{escape(entry.link)}">{escape(entry.name)}</a></td>'
        f"<td>{entry.change.input.ovrl:.2f}</td><td>{entry.change.output.ovrl:.2f}</td>"
        + "".join(f"<td>{_signed(getattr(entry.change.change, key))}</td>" for key in KEYS)
        + "</tr>" for entry in ordered)
    left_out = (f"<p class=\"note\">{unscored} other file(s) of the batch were not enhanced in "
                "this run (failed, skipped or not audio) and have no page.</p>"
                if unscored else "")
    picture = (f'<img alt="distribution of the score changes" src="{histograms}">'
               if histograms else "")
    heads = "".join(f"<th>{key.upper()} change</th>" for key in KEYS)
    body = f"""<h1>speechlens: {len(entries)} files enhanced</h1>
<p>OVRL got worse for <strong>{worse}</strong> of {len(entries)} files, better or equal for
{len(entries) - worse}; those that got worse come first below.</p>
{left_out}<h2>How the scores changed</h2>
{picture}
<h2>Files</h2>
<table><thead><tr><th>file</th><th>OVRL input</th><th>OVRL output</th>{heads}</tr></thead>
<tbody>{rows}</tbody></table>
<p class="note">{DNSMOS_NOTE} Each file's page has its players and spectrograms.</p>
"""
    return _document("speechlens report", body)
