"""Reliability, the download itself (docs/reliability.md, section 2b): the real huggingface_hub
client against a local server that speaks the hub's protocol (tests/hub_server.py).

The checkpoint served is the tiny generated one, under nvidia/RE-USE at the pinned revision. Its
sha256 is not NVIDIA's, so tests that complete a download pin the served file's digest in
process; the failing ones run the CLI in a child process, HF_ENDPOINT set as a user would set it,
under a timeout. Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from speechlens_cli import checkpoint, hub
from tests.hub_server import LocalHub, LocalProxy
from tests.reliability import (
    audit_outputs,
    cases,
    invoke,
    make_audio,
    one_error_line,
    run_child,
)

REPO_ID, REVISION = checkpoint.DEFAULT_REPO, checkpoint.PINNED_REVISION
NAMES = (checkpoint.WEIGHTS_FILE, checkpoint.CONFIG_FILE)


def _files(checkpoint_folder: Path) -> dict[str, bytes]:
    return {name: (checkpoint_folder / name).read_bytes() for name in NAMES}


def _cached_files(cache: Path) -> list[str]:
    """Every file the hub client left in the cache (blobs, snapshots, temporaries)."""
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")
                  if (p.is_file() or p.is_symlink()) and ".locks" not in p.parts
                  and p.name != "CACHEDIR.TAG")


def _error_after_the_license(stderr: str) -> str:
    """--accept-license shows the terms first; after them, exactly one error line."""
    shown, _, rest = stderr.partition("\n")
    assert shown == checkpoint.LICENSE_NOTE, stderr
    return one_error_line(rest)


def _resolved(local: LocalHub) -> list[str]:
    return [path for role, _method, path, _range in local.requests
            if role == "hub" and "/resolve/" in path]


@pytest.fixture
def local_hub(tmp_path, monkeypatch, tiny_checkpoint):
    """The hub at HF_ENDPOINT, nothing cached, the license not accepted yet, the served
    weights' digest pinned in this process."""
    files = _files(tiny_checkpoint)
    with LocalHub(REPO_ID, REVISION, files) as local:
        monkeypatch.setenv("HF_ENDPOINT", local.endpoint)
        # what HF_ENDPOINT / HF_HOME at import would have set (the client's agent registry)
        monkeypatch.setattr(constants, "ENDPOINT", local.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            local.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf-home" / "ah"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for name in ("HF_HUB_OFFLINE", checkpoint.LICENSE_ENV, checkpoint.MODEL_ENV):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(checkpoint.locate, "_license_accepted", False)
        monkeypatch.setattr(checkpoint.locate, "PINNED_SHA256",
                            hashlib.sha256(files[checkpoint.WEIGHTS_FILE]).hexdigest())
        yield local


@cases(2)   # refused before the license, then downloaded
def test_the_first_download_comes_after_the_license_and_fetches_the_pinned_revision(
        tmp_path, local_hub):
    """Without the license accepted (no terminal to ask on): refused, and not one request
    reached the hub. Accepted: both files of the pinned revision, never `main`, each fetched
    once, the weights from the CDN the hub redirects to; the output is written."""
    source = make_audio(tmp_path / "a.wav")
    refused = invoke("enhance", source, tmp_path / "out.wav")
    assert refused.exit_code == 2
    assert checkpoint.LICENSE_NOTE in one_error_line(refused.stderr)
    assert local_hub.requests == [] and not (tmp_path / "hf-cache").exists()

    result = invoke("enhance", source, tmp_path / "out.wav", "--accept-license")
    assert result.exit_code == 0, result.output
    resolved = _resolved(local_hub)
    assert {path.split("/resolve/")[1] for path in resolved} == \
        {f"{REVISION}/{name}" for name in NAMES}, resolved
    transfers = [path for role, method, path, _ in local_hub.requests if method == "GET"
                 and role == "cdn"]
    assert len(transfers) == 1, local_hub.requests
    audit_outputs(tmp_path, {"out.wav": 400})


def test_enhance_reuses_the_cache_offline(tmp_path, local_hub, monkeypatch):
    """After `models pull`, with the hub gone and HF_HUB_OFFLINE=1, enhance runs from the cache
    without asking for the license again; the output equals the one made online."""
    pulled = invoke("models", "pull", "--accept-license")
    assert pulled.exit_code == 0, pulled.output
    source = make_audio(tmp_path / "a.wav")
    assert invoke("enhance", source, tmp_path / "online.wav").exit_code == 0
    local_hub.close()
    asked = len(local_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(checkpoint.locate, "_license_accepted", False)
    result = invoke("enhance", source, tmp_path / "offline.wav")
    assert result.exit_code == 0, result.output
    assert len(local_hub.requests) == asked
    assert (tmp_path / "offline.wav").read_bytes() == (tmp_path / "online.wav").read_bytes()


def test_a_download_failing_its_checksum_is_not_kept(tmp_path, local_hub):
    """The CDN delivers the weights with one byte changed (the advertised sha256 unchanged):
    one line, exit 1, nothing of it left in the cache, so the next pull is a fresh download
    that succeeds once the bytes are right."""
    local_hub.faults.altered = True
    result = invoke("models", "pull", "--accept-license")
    assert result.exit_code == 1
    line = _error_after_the_license(result.stderr)
    assert "not the pinned" in line and "not kept" in line, line
    assert _cached_files(tmp_path / "hf-cache") == []
    local_hub.faults.altered = False
    again = invoke("models", "pull", "--accept-license")
    assert again.exit_code == 0, again.output
    assert checkpoint.locate.PINNED_SHA256 in again.output


def test_a_transfer_cut_halfway_resumes_where_it_stopped(tmp_path, local_hub, monkeypatch):
    """The connection closes halfway through the weights: the client asks for the rest with a
    Range request, and the file is complete and checksummed."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # the tiny file: 9 blocks
    local_hub.faults.cut_once = True
    result = invoke("models", "pull", "--accept-license")
    assert result.exit_code == 0, result.output
    ranges = [wanted for role, method, _path, wanted in local_hub.requests
              if role == "cdn" and method == "GET"]
    size = len(local_hub.files[checkpoint.WEIGHTS_FILE])
    assert len(ranges) == 2 and ranges[0] is None, ranges
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= size // 2, (resumed_at, size)
    assert checkpoint.locate.PINNED_SHA256 in result.output


#: fault -> (what the hub does, text of the one line, seconds it may take)
HUB_FAULTS = {
    "401": ({"status": 401}, "the hub refused access (401)", 10),
    "404-file": ({"files": [checkpoint.CONFIG_FILE]}, "has no model.safetensors there (404)", 10),
    "404-revision-gone": ({"commit": "f" * 40}, "has no such revision (404)", 10),
    "500": ({"status": 500}, "failed with 500", 10),
    "silent-hub": ({"stall": "metadata"}, f"did not answer within {hub.HUB_TIMEOUT_S:g} s", 20),
    "stalled-transfer": ({"stall": "transfer"}, "stopped sending it and did not resume", 40),
}


@pytest.mark.parametrize("fault", sorted(HUB_FAULTS))
def test_a_failing_hub_is_one_line_within_seconds(tmp_path, tiny_checkpoint, fault):
    """`enhance` with the license accepted (the variable) and nothing cached, in a child
    process: one line naming the cause and the fix, exit 1, within the bound (the client's own
    retries took 23 s for a 500 and minutes for a silent hub), no output, nothing cached."""
    behaviour, text, bound = HUB_FAULTS[fault]
    files = _files(tiny_checkpoint)
    files = {name: files[name] for name in behaviour.get("files", NAMES)}
    with LocalHub(REPO_ID, behaviour.get("commit", REVISION), files) as local:
        local.faults.status = behaviour.get("status")
        local.faults.stall = behaviour.get("stall")
        started = time.monotonic()
        result = run_child(
            ["enhance", make_audio(tmp_path / "a.wav"), tmp_path / "out.wav"],
            timeout=bound + 30,
            env={"HF_ENDPOINT": local.endpoint, "HF_HOME": str(tmp_path / "hf-home"),
                 "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE": "0",
                 "HF_HUB_DOWNLOAD_TIMEOUT": "1", checkpoint.MODEL_ENV: "",
                 checkpoint.LICENSE_ENV: "1"})
        took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    line = one_error_line(result.stderr)
    assert text in line and "--model PATH" in line, line
    assert took < bound, took
    assert not (tmp_path / "out.wav").exists()
    cache = tmp_path / "hf-cache"
    assert not cache.exists() or _cached_files(cache) == [], _cached_files(cache)


@cases(2)   # a download carried by HTTP_PROXY; an HTTPS hub asked for with CONNECT
def test_a_proxy_set_for_the_hub_is_used(tmp_path, tiny_checkpoint):
    """Behind a proxy only the proxy reaches the hub. speechlens used to open a connection of
    its own first, which ignores HTTPS_PROXY / HTTP_PROXY, and refused with "cannot be reached"
    before huggingface_hub, which honours them, made a request. Now every request is the
    client's: a whole download through the proxy (a repo that is not NVIDIA's: no license, no
    pinned checksum), and an HTTPS hub asked for with the proxy's CONNECT, whose refusal is one
    line naming the proxy."""
    unreachable = "127.0.0.1:9"   # the hub's address as this machine sees it: nothing there
    environment = {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_CACHE": str(tmp_path / "hf"),
                   "HF_HUB_OFFLINE": "0", checkpoint.MODEL_ENV: "", "NO_PROXY": "",
                   "no_proxy": ""}
    with LocalHub("someone/model", "a" * 40, _files(tiny_checkpoint)) as local, \
            LocalProxy({unreachable: local.endpoint.removeprefix("http://")}) as proxy:
        pulled = run_child(["models", "pull", "someone/model"], timeout=60, env={
            **environment, "HF_ENDPOINT": f"http://{unreachable}", "HTTP_PROXY": proxy.url,
            "http_proxy": proxy.url})
    assert pulled.returncode == 0, pulled.stderr
    assert "ok: sha256" in pulled.stdout
    assert ("HEAD", f"http://{unreachable}/someone/model/resolve/main/model.safetensors") \
        in proxy.requests, proxy.requests
    assert any(method == "GET" and target.startswith(local.cdn_url)
               for method, target in proxy.requests), proxy.requests

    with LocalProxy() as proxy:
        refused = run_child(["models", "pull", "someone/model"], timeout=60, env={
            **environment, "HF_ENDPOINT": f"https://{unreachable}", "HTTPS_PROXY": proxy.url,
            "https_proxy": proxy.url, "HF_HUB_CACHE": str(tmp_path / "hf-2")})
    assert refused.returncode == 1, refused.stderr
    line = one_error_line(refused.stderr)
    assert f"cannot be reached through the proxy {proxy.url}" in line, line
    assert ("CONNECT", unreachable) in proxy.requests, proxy.requests
