"""`Vision`: a model's projector (libmtmd): images to prompt positions and embeddings.

llama.cpp's libmtmd (the ctypes bindings in `llama_cpp.mtmd_cpp`) loads the projector
GGUF beside the text model, decodes image files (stb_image), preprocesses them and
encodes them into rows of the text model's input embeddings. Here:
- `tokenize` (any thread, as llama-server's HTTP threads do: mtmd_tokenize only reads
  the context) cuts the prompt at its markers: text chunks give their tokens, each
  image chunk its positions as ids < 0 (engine/media.py);
- `embeddings` (the engine thread only: mtmd_encode_chunk writes the context) encodes
  one image, and keeps the last few encoded by digest, so a second turn about the same
  picture encodes nothing again.
Decoding an image file (stb_image) and preprocessing it (resize, normalize) is the slow
part, and `tokenize` does it off the engine thread anyway: it keeps each image chunk it
made (`_Prepared`) for `embeddings` to encode, so the engine thread, which stalls every
slot while it works, decodes no image file. Measured (a 1024 x 1024 PNG of 3.1 MB, the
tests' projector, 2 cores, median of 8): embeddings() 19.6 ms when it decoded the file
again, 1.9 ms encoding the kept chunk; tokenize 17.3 ms before, 16.8 ms with the copy.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from llama_cpp import mtmd_cpp as M

from cache.keys import model_fingerprint
from engine.media import media_ids
from engine.types import InvalidRequestError, Media

log = logging.getLogger(__name__)

_TEXT_CHUNK = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT
_IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE
# The image files stb_image reads, by their leading bytes. Anything else is refused
# before libmtmd sees it: its helper would try the bytes as audio, then start ffprobe.
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM")
EMBEDDINGS_KEPT = 8  # images whose encoded embeddings the engine thread keeps
# Images tokenized and not yet encoded whose prepared chunks are kept: twice a request's
# default [media] max_images. A chunk holds the image as the projector takes it (its
# input size, float32: 48 KB for the tests' 64 px projector, ~9.6 MB for Gemma 3's
# 896 px), not the file; one evicted before its prefill is decoded again, on the engine
# thread (logged).
PREPARED_KEPT = 32


def projector_beside(model_path: str) -> str | None:
    """The one `mmproj*.gguf` in the model file's folder (None: none, or several), as a
    downloaded VLM is laid out: the model's GGUF and its projector side by side."""
    folder = os.path.dirname(os.path.abspath(model_path))
    try:
        found = sorted(
            n for n in os.listdir(folder) if n.startswith("mmproj") and n.endswith(".gguf")
        )
    except OSError:
        return None
    if len(found) > 1:
        log.warning("vision: %d mmproj*.gguf beside %s, none taken (name one with `mmproj`)",
                    len(found), model_path)  # fmt: skip
    return os.path.join(folder, found[0]) if len(found) == 1 else None


class Vision:
    """A loaded projector for one text model. Freed before the model (`close`)."""

    def __init__(self, path: str, model_handle: int, *, threads: int, use_gpu: bool):
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        handle = M.mtmd_init_from_file(path.encode(), model_handle, params)
        if not handle:
            raise RuntimeError(
                f"llama.cpp could not load the vision projector at {path} (a projector "
                "GGUF made for this model? its output width must match the model's)"
            )
        self.handle = handle
        if not M.mtmd_support_vision(handle) or M.mtmd_decode_use_mrope(handle):
            self.close()
            raise RuntimeError(
                f"the projector at {path} is not supported: kvserve takes vision projectors "
                "whose image rows sit at consecutive positions (no audio-only, no M-RoPE)"
            )
        self.path = path
        self.marker: str = (M.mtmd_default_marker() or b"<__media__>").decode()
        # In every image id: KV computed through one projector never keys another's.
        self.identity = model_fingerprint(path)
        # Set by the first image encoded: its rows attend to each other both ways
        # (Gemma 3), so an image is decoded in one batch with causal attention off.
        self.non_causal = False
        self._embeddings: OrderedDict[str, np.ndarray] = OrderedDict()
        self._prepared = _Prepared(PREPARED_KEPT)

    def close(self) -> None:
        self._prepared.clear()
        if self.handle:
            M.mtmd_free(self.handle)
            self.handle = None

    def tokenize(self, text: str, media: Sequence[Media], *, add_special: bool) -> list[int]:
        """The prompt's ids: text chunks tokenized as mtmd does (parse_special), each
        image's positions as ids < 0. InvalidRequestError names the image that failed."""
        if text.count(self.marker) != len(media):
            raise InvalidRequestError(
                f"the prompt marks {text.count(self.marker)} images and carries {len(media)}",
                param="image",
            )
        chunks = self._chunks(text, media, add_special=add_special)
        try:
            tokens: list[int] = []
            image = 0
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                kind = M.mtmd_input_chunk_get_type(chunk)
                if kind == _TEXT_CHUNK:
                    n = ctypes.c_size_t()
                    ids = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    tokens += ids[: n.value]
                elif kind == _IMAGE_CHUNK:
                    count = M.mtmd_input_chunk_get_n_tokens(chunk)
                    tokens += media_ids(media[image].digest, count, self.identity)
                    self._prepared.keep(media[image].digest, chunk)
                    image += 1
                else:
                    raise InvalidRequestError("only images are supported", param="image")
            return tokens
        finally:
            M.mtmd_input_chunks_free(chunks)

    def embeddings(self, image: Media, num_tokens: int, n_embd: int) -> np.ndarray:
        """The image's rows of input embeddings, (num_tokens, n_embd) float32. Engine
        thread only; the last EMBEDDINGS_KEPT images are kept by digest."""
        kept = self._embeddings.get(image.digest)
        if kept is not None:
            self._embeddings.move_to_end(image.digest)
            return kept
        chunk = self._prepared.take(image.digest)
        if chunk is None:  # not tokenized here, or evicted since: decoded once more
            log.info("vision: image %s.. was not kept from its tokenize; decoding it on the "
                     "engine thread", image.digest[:12])  # fmt: skip
            chunk = self._image_chunk(image)
        try:
            count = M.mtmd_input_chunk_get_n_tokens(chunk)
            if count != num_tokens:
                raise InvalidRequestError(
                    f"the image takes {count} positions, the prompt holds {num_tokens}",
                    param="image",
                )
            self.non_causal = bool(M.mtmd_decode_use_non_causal(self.handle, chunk))
            if M.mtmd_encode_chunk(self.handle, chunk) != 0:
                raise RuntimeError("mtmd_encode_chunk failed")
            out = M.mtmd_get_output_embd(self.handle)
            rows = np.ctypeslib.as_array(out, shape=(count * n_embd,)).reshape(count, n_embd)
            rows = rows.astype(np.float32, copy=True)  # the context's buffer is reused
        finally:
            M.mtmd_input_chunk_free(chunk)
        self._embeddings[image.digest] = rows
        while len(self._embeddings) > EMBEDDINGS_KEPT:
            self._embeddings.popitem(last=False)
        return rows

    def _image_chunk(self, image: Media) -> int:
        """The image's chunk, decoded and prepared now (the caller frees it)."""
        chunks = self._chunks(self.marker, [image], add_special=False)
        try:
            return next(  # type: ignore[no-any-return]
                M.mtmd_input_chunk_copy(M.mtmd_input_chunks_get(chunks, i))
                for i in range(M.mtmd_input_chunks_size(chunks))
                if M.mtmd_input_chunk_get_type(M.mtmd_input_chunks_get(chunks, i)) == _IMAGE_CHUNK
            )
        finally:
            M.mtmd_input_chunks_free(chunks)

    def _chunks(self, text: str, media: Sequence[Media], *, add_special: bool) -> int:
        """mtmd_tokenize's chunks of `text` with `media` (the caller frees them)."""
        bitmaps: list[int] = []
        try:
            for index, image in enumerate(media):
                bitmaps.append(self._bitmap(index, image))
            data = text.encode()
            entry = M.mtmd_input_text(
                text=data, text_len=len(data), add_special=add_special, parse_special=True
            )
            array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            chunks = M.mtmd_input_chunks_init()
            code = M.mtmd_tokenize(self.handle, chunks, ctypes.byref(entry), array, len(bitmaps))
            if code != 0:
                M.mtmd_input_chunks_free(chunks)
                # 1: the markers and the images differ in number; 2: preprocessing failed
                raise InvalidRequestError(
                    f"the projector could not take the prompt's images (mtmd_tokenize: {code})",
                    param="image",
                )
            return chunks  # type: ignore[no-any-return]
        finally:
            for bitmap in bitmaps:
                M.mtmd_bitmap_free(bitmap)

    def _bitmap(self, index: int, image: Media) -> int:
        """The decoded image, its id the digest (mtmd's chunk id, as llama-server's)."""
        bad = InvalidRequestError(
            f"image {index} cannot be decoded (PNG, JPEG, GIF or BMP bytes expected)",
            param=f"image {index}",
        )
        if not image.data.startswith(_IMAGE_MAGIC):
            raise bad
        buf = (ctypes.c_ubyte * len(image.data)).from_buffer_copy(image.data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.handle, buf, len(image.data), False)
        if not bitmap:
            raise bad
        if M.mtmd_bitmap_is_audio(bitmap):
            M.mtmd_bitmap_free(bitmap)
            raise bad
        M.mtmd_bitmap_set_id(bitmap, image.digest.encode())
        return bitmap


class _Prepared:
    """Image chunks `tokenize` made (any thread), kept by digest until `embeddings`
    takes one (the engine thread); the oldest past `most` are freed. Thread-safe."""

    def __init__(self, most: int):
        self.most = most
        self._lock = threading.Lock()
        self._chunks: OrderedDict[str, int] = OrderedDict()  # digest -> mtmd_input_chunk

    def keep(self, digest: str, chunk: int) -> None:
        """Keep a copy of `chunk` (the caller's is freed with its mtmd_input_chunks)."""
        with self._lock:
            if digest in self._chunks:  # the same picture again: one copy is enough
                self._chunks.move_to_end(digest)
                return
            self._chunks[digest] = M.mtmd_input_chunk_copy(chunk)
            while len(self._chunks) > self.most:
                M.mtmd_input_chunk_free(self._chunks.popitem(last=False)[1])

    def take(self, digest: str) -> int | None:
        """The chunk kept for `digest`, now the caller's to free; None: none kept."""
        with self._lock:
            return self._chunks.pop(digest, None)

    def clear(self) -> None:
        with self._lock:
            for chunk in self._chunks.values():
                M.mtmd_input_chunk_free(chunk)
            self._chunks.clear()
