from __future__ import annotations

from pathlib import Path

from cache import model_fingerprint, namespace
from cache.keys import block_hashes, entry_key, seed, token_bytes, tokens_from_bytes


def test_block_hashes_chain_over_every_earlier_block() -> None:
    s = seed("ns", "")
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, s)
    b = block_hashes([1, 2, 3, 0, 5, 6, 7, 8], 4, s)
    assert len(a) == 2  # the partial ninth token is not hashed
    assert a[0] != b[0] and a[1] != b[1]  # block 2 is equal, but its chain is not
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, s) == a
    assert block_hashes([1, 2, 3], 4, s) == []


def test_salt_and_namespace_change_every_key() -> None:
    tokens = list(range(8))
    plain = block_hashes(tokens, 4, seed("ns", ""))
    assert not set(plain) & set(block_hashes(tokens, 4, seed("ns", "tenant")))
    assert not set(plain) & set(block_hashes(tokens, 4, seed("other", "")))
    assert seed("ab", "c") != seed("a", "bc")  # length-prefixed parts


def test_entry_key_names_exact_tokens() -> None:
    s = seed("ns", "")
    assert entry_key(s, [1, 2, 3]) != entry_key(s, [1, 2, 3, 0])
    assert entry_key(s, [1, 2, 3]) == entry_key(s, (1, 2, 3))


def test_token_bytes_round_trip_as_int32_le() -> None:
    assert token_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert tokens_from_bytes(token_bytes([0, 7, 2**31 - 1])) == (0, 7, 2**31 - 1)


def test_namespace_separates_parts_and_types() -> None:
    assert namespace("m", 4096, "f16") == namespace("m", 4096, "f16")
    assert namespace("m", 4096, "f16") != namespace("m", 2048, "f16")
    assert namespace("m", 1) != namespace("m", "1")
    assert namespace("ab", "c") != namespace("a", "bc")
    assert len(namespace("x")) == 16 and int(namespace("x"), 16) >= 0


def test_model_fingerprint_sees_size_head_tail_and_name(tmp_path: Path) -> None:
    body = bytearray(3 << 20)
    model = tmp_path / "model.gguf"
    model.write_bytes(body)
    base = model_fingerprint(str(model))
    assert model_fingerprint(str(model)) == base and base.startswith("model.gguf:")

    body[-1] = 1  # the last MiB is hashed
    model.write_bytes(body)
    tail = model_fingerprint(str(model))
    body[(3 << 20) // 2] = 1  # the middle is not read: cheap on a multi-GB file
    model.write_bytes(body)
    assert model_fingerprint(str(model)) == tail != base

    renamed = tmp_path / "other.gguf"
    model.rename(renamed)
    assert model_fingerprint(str(renamed)) != tail
