"""GGUF files fetched from a Hugging Face-compatible hub (`hf_repo` in a model's config).

Downloads go through `huggingface_hub`, so its cache directory (HF_HOME / HF_HUB_CACHE or
`hub.cache_dir`), its resumable `.incomplete` files, HF_TOKEN, HF_ENDPOINT and
HF_HUB_OFFLINE all apply as they do for every other tool of that ecosystem. A file is
only handed to llama.cpp once the library has renamed it complete, and a freshly
downloaded file is checked against the sha256 the hub lists for it.

A model's vision projector comes along as llama-server's `-hf` fetches it
(`fetch(..., projector=True)`, `choose_projector`): the repository's `mmproj` GGUF nearest the
model's folder and quantization, downloaded with the model and under the same checks.

Every failure is a `HubError` whose text is one line naming the config key (the error and
`HubSource`, which the config's checks parse too, are server/config/hub.py's).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config.hub import HubError, HubSource

log = logging.getLogger("kvserve.server")

Progress = Callable[[float], None]

# A split GGUF's shards: model-00001-of-00003.gguf
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# A file's quant tag as llama.cpp's download.cpp reads it: the last [-.] word of the
# name without ".gguf" (and without a shard suffix): "mmproj-model-f16" -> "f16".
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


class NoRoom(HubError):
    """A download refused before its first byte: the file does not fit (free space, or
    the budget the hook passed to `fetch` keeps)."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """What the hub's listing says of one file."""

    sha256: str  # "" when the hub lists none (not an LFS file)
    size: int  # bytes; 0 when not listed


def choose_file(source: HubSource, names: list[str]) -> str:
    """The GGUF among the repository's file names that `source` asks for."""
    if source.file:
        if source.file not in names:
            raise HubError(f"{source.key}: file {source.file!r} not found in {source.repo}")
        return source.file
    ggufs = [n for n in names if n.lower().endswith(".gguf") and not _is_projector(n)]
    if not ggufs:
        raise HubError(f"{source.key}: no GGUF file in {source.repo}")
    if source.quant:
        # The tag as a whole word of the name: Q4_K does not pick Q4_K_M.
        tag = re.compile(rf"(^|[-._/]){re.escape(source.quant)}([-.]|$)", re.IGNORECASE)
        ggufs = [n for n in ggufs if tag.search(n)]
        if not ggufs:
            raise HubError(f"{source.key}: no GGUF file for quant {source.quant} in {source.repo}")
    first_shards = [n for n in ggufs if _shard_index(n) in (None, 1)]
    if len(first_shards) > 1:
        which = "quant " + source.quant if source.quant else "no quant given"
        raise HubError(
            f"{source.key}: ambiguous ({which}): {', '.join(sorted(first_shards))}; "
            "name one with :QUANT or hf_file"
        )
    chosen = first_shards[0]
    if _SHARD.search(chosen):
        raise HubError(f"{source.key}: split GGUF files are not supported ({chosen})")
    return chosen


def _shard_index(name: str) -> int | None:
    found = _SHARD.search(name)
    return int(found.group(1)) if found else None


def _is_projector(name: str) -> bool:
    """A vision projector's GGUF (llama.cpp's mmproj), never taken as the model."""
    return "mmproj" in name.lower()


def choose_projector(model_file: str, names: list[str]) -> str | None:
    """The projector llama-server's `-hf` takes with `model_file` (llama.cpp's
    common/download.cpp, `find_best_sibling(files, model, "mmproj")`): among the
    repository's `mmproj` GGUFs in the model's folder or a folder above it, the deepest,
    then the one whose quant's bits are nearest the model's (a Q8_0 model takes
    mmproj-Q8_0 over mmproj-f16; a Q4_K_M one takes mmproj-Q8_0 over f16), then the
    first by name. None: the repository has none."""
    model_dir = model_file.split("/")[:-1]
    model_bits = _quant_bits(model_file)
    best: tuple[int, int] | None = None  # (-depth, bits apart): smaller is better
    chosen = None
    for name in sorted(names):
        if not (name.lower().endswith(".gguf") and _is_projector(name)):
            continue
        folder = name.split("/")[:-1]
        if model_dir[: len(folder)] != folder:  # not the model's folder nor above it
            continue
        rank = (-len(folder), abs(_quant_bits(name) - model_bits))
        if best is None or rank < best:
            best, chosen = rank, name
    return chosen


def _quant_bits(name: str) -> int:
    """The bits of a file's quant tag (Q4_K_M: 4, Q8_0: 8, f16 and BF16: 16; 0: none),
    as llama.cpp's `extract_quant_bits`."""
    stem = _SHARD.sub("", name)  # a shard's suffix, ".gguf" included
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    tag = _TAG.search(stem)
    digits = re.search(r"\d+", tag.group(1)) if tag else None
    return int(digits.group(0)) if digits else 0


def fetch(
    source: HubSource,
    on_progress: Progress | None = None,
    *,
    endpoint: str | None = None,
    offline: bool | None = None,
    before_download: Callable[[str, int], None] | None = None,
    projector: bool = False,
) -> str:
    """The local path of the model's GGUF, downloading it first if it is not cached;
    with `projector`, of the vision projector that goes with it (`choose_projector`),
    "" when the repository has none (same checks, same `before_download`).

    `endpoint`/`offline` default to huggingface_hub's (HF_ENDPOINT, HF_HUB_OFFLINE);
    offline or with the hub out of reach, only a file in the local cache is found.
    `before_download(filename, size)` runs once the file is known to need a download,
    before any byte of it is written; it refuses by raising (NoRoom)."""

    def pick(src: HubSource, names: list[str]) -> str | None:
        # choose_file names a file or raises: the model's path is never None
        model = choose_file(src, names)
        return choose_projector(model, names) if projector else model

    return _fetch(source, pick, on_progress, endpoint, offline, before_download) or ""


def _fetch(
    source: HubSource,
    pick: Callable[[HubSource, list[str]], str | None],
    on_progress: Progress | None,
    endpoint: str | None,
    offline: bool | None,
    before_download: Callable[[str, int], None] | None,
) -> str | None:
    """The local path of the file `pick` chooses among the repository's names (None:
    it chose none), downloaded first if it is not cached."""
    import huggingface_hub as hf  # here, not at import: only configs with hf_repo need it
    from huggingface_hub import constants as hf_constants
    from huggingface_hub import errors as hf_errors

    if offline is None:
        offline = hf_constants.is_offline_mode()
    cache_dir = source.cache_dir or None
    revision = source.revision or None
    try:
        if offline:
            names, expected = _cached_names(source, cache_dir), None
        else:
            names, expected = _listing(source, endpoint, cache_dir)
        filename = pick(source, names)
        if filename is None:
            return None
        cached = hf.try_to_load_from_cache(source.repo, filename, cache_dir, revision)
        listed = expected.get(filename) if expected is not None else None
        if before_download is not None and listed is not None and not _current(cached, listed):
            before_download(filename, listed.size)
        path = hf.hf_hub_download(
            source.repo,
            filename,
            revision=revision,
            cache_dir=cache_dir,
            endpoint=endpoint,
            local_files_only=expected is None,  # offline, or the hub is out of reach
            tqdm_class=_progress_bar(on_progress),
        )
    except HubError:
        raise
    except hf_errors.RepositoryNotFoundError:
        raise HubError(f"{source.key}: repository {source.repo} not found") from None
    except hf_errors.RevisionNotFoundError:
        raise HubError(f"{source.key}: revision {source.revision!r} not found") from None
    except hf_errors.EntryNotFoundError as exc:
        where = "in the local cache (offline)" if offline else f"in {source.repo}"
        raise HubError(f"{source.key}: file not found {where}: {_first_line(exc)}") from None
    except Exception as exc:  # network failures (httpx's or OSError), HTTP errors, offline
        raise HubError(f"{source.key}: download failed: {_first_line(exc)}") from None
    if listed is not None and cached != path:  # downloaded now: check it once
        _verify(source, path, listed.sha256)
    if on_progress is not None:
        on_progress(1.0)
    return str(path)


def _current(cached: object, listed: RemoteFile) -> bool:
    """Whether the cached copy (try_to_load_from_cache's answer) is the file listed:
    an LFS blob is named by its sha256."""
    if not isinstance(cached, str):
        return False
    return not listed.sha256 or os.path.basename(os.path.realpath(cached)) == listed.sha256


def _listing(
    source: HubSource, endpoint: str | None, cache_dir: str | None
) -> tuple[list[str], dict[str, RemoteFile] | None]:
    """The hub's listing of the repository (names, sha256 sums, sizes); when the hub cannot be
    reached and the local cache holds the revision, the cache's names and no sums (an
    outage must not stop a model that is already here: issue 17)."""
    try:
        return _remote_names(source, endpoint)
    except Exception as exc:
        if not _unreachable(exc):
            raise
        try:
            names = _cached_names(source, cache_dir)
        except Exception:
            raise exc from None  # nothing cached either: the hub's failure is the news
        log.warning(
            "%s: the hub cannot be reached (%s); using the copy in the local cache",
            source.key,
            _first_line(exc),
        )
        return names, None


def _unreachable(exc: Exception) -> bool:
    """A failure of the hub or the way to it (refused, timed out, 5xx, 429), not an
    answer about the repository (not found, no access)."""
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.HfHubHTTPError):  # the hub answered
        status = getattr(exc.response, "status_code", 0)
        return status >= 500 or status == 429
    return isinstance(exc, _transport_errors())


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The errors of no answer at all. huggingface_hub's HTTP client is httpx2 (2.x) or
    httpx (1.x), whose TransportError covers refused, reset and timed out; requests (0.x)
    raises OSErrors, as sockets do."""
    found: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            found.append(importlib.import_module(name).TransportError)
    return tuple(found)


def _remote_names(
    source: HubSource, endpoint: str | None
) -> tuple[list[str], dict[str, RemoteFile]]:
    """The repository's files, with the sha256 (LFS files) and size the hub lists."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint).model_info(
        source.repo, revision=source.revision or None, files_metadata=True
    )
    siblings = info.siblings or []
    files = {
        s.rfilename: RemoteFile(
            (s.lfs.sha256 or "") if s.lfs is not None else "",
            int(s.size or (s.lfs.size if s.lfs is not None else 0) or 0),
        )
        for s in siblings
    }
    return [s.rfilename for s in siblings], files


def _cached_names(source: HubSource, cache_dir: str | None) -> list[str]:
    """Offline: the GGUF names of the revision's snapshot in the local cache."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(
        source.repo,
        revision=source.revision or None,
        cache_dir=cache_dir,
        local_files_only=True,
    )
    root = Path(folder)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _verify(source: HubSource, path: str, sha256: str | None) -> None:
    if not sha256:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != sha256.lower():
        # Neither load it nor leave it to be found in the cache next time.
        blob = os.path.realpath(path)
        for victim in {path, blob}:
            if os.path.lexists(victim):
                os.remove(victim)
        raise HubError(
            f"{source.key}: sha256 mismatch for {os.path.basename(path)} "
            f"(expected {sha256}, got {digest.hexdigest()}); the file was removed"
        )


def _progress_bar(on_progress: Progress | None) -> Any:
    """huggingface_hub's terminal bar, also reporting the fraction to `on_progress`."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    if on_progress is None:
        return hf_tqdm
    report = on_progress

    class Bar(hf_tqdm):  # type: ignore[misc, valid-type]
        # Counted here too: a disabled bar (HF_HUB_DISABLE_PROGRESS_BARS) counts nothing.
        seen = 0.0

        def update(self, n: float | None = 1) -> bool | None:
            self.seen += n or 0
            if self.total:
                report(min(1.0, self.seen / self.total))
            return super().update(n)  # type: ignore[no-any-return]

    return Bar


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
