"""The header of a KV cache file and its validation: magic, format version, model hash, payload length,
digest of the payload (little-endian `struct`, 62 bytes, then the payload). Invariants: the declared length
is compared with the file size before anything is read; the version names the digest (`DIGESTS`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

MAGIC = b"EVKV"
FORMAT_VERSION = 2                     # what this build writes; it reads every version in DIGESTS
HEADER = struct.Struct("<4sH16sQ32s")  # magic, version u16, model hash (16 ascii), payload length u64, digest
HEADER_SIZE = HEADER.size  # 62
_PREFIX = struct.Struct("<4sH")

Payload = bytes | bytearray | memoryview


class InvalidKVFile(Exception):
    """A cache file that must not be used; the message says why (it becomes the log line)."""


@dataclass(frozen=True)
class KVHeader:
    version: int
    model_hash: str
    payload_length: int
    payload_digest: bytes


def _xxh3_128(payload: Payload) -> bytes:
    return xxhash.xxh3_128_digest(payload).ljust(32, b"\0")


def _sha256(payload: Payload) -> bytes:
    return hashlib.sha256(payload).digest()


# The digest of each format version, in the header's 32-byte field. The checksum guards against damage
# (a torn write, a bad disk), not an attacker, who could rewrite the digest as easily as the payload. On a
# 64 MB file mapped from the page cache (AMD EPYC with SHA-NI, 2026-11-24): xxh3-128 3 ms, sha256 37 ms,
# which was most of a reopen's open; 128 bits still catch what a 32-bit CRC could miss.
DIGESTS: dict[int, Callable[[Payload], bytes]] = {1: _sha256, 2: _xxh3_128}


def payload_digest(payload: Payload, version: int = FORMAT_VERSION) -> bytes:
    return DIGESTS[version](payload)


def pack_header(model_hash: str, payload: Payload) -> bytes:
    encoded_hash = model_hash.encode("ascii")
    if len(encoded_hash) != 16:
        raise ValueError(f"model hash must be 16 ascii characters, got {model_hash!r}")
    return HEADER.pack(MAGIC, FORMAT_VERSION, encoded_hash, memoryview(payload).nbytes,
                       payload_digest(payload))


def validate_header(raw: bytes, file_size: int, expected_model_hash: str) -> KVHeader:
    """Check the header bytes (the first <= 62 bytes of the file) against the file size and model."""
    if not raw:
        raise InvalidKVFile("empty file")
    if len(raw) < len(MAGIC) or raw[:len(MAGIC)] != MAGIC[:len(raw)]:
        raise InvalidKVFile("bad magic (not an Evoke KV cache file)")
    if len(raw) < _PREFIX.size:
        raise InvalidKVFile(f"truncated header ({len(raw)} of {HEADER_SIZE} bytes)")
    _, version = _PREFIX.unpack_from(raw)
    if version not in DIGESTS:
        raise InvalidKVFile(f"format version {version}, this build reads versions "
                            f"{', '.join(map(str, sorted(DIGESTS)))}")
    if len(raw) < HEADER_SIZE:
        raise InvalidKVFile(f"truncated header ({len(raw)} of {HEADER_SIZE} bytes)")
    _, _, model_hash, payload_length, digest = HEADER.unpack_from(raw)
    if model_hash != expected_model_hash.encode("ascii"):
        raise InvalidKVFile(f"written for model {model_hash.decode('ascii', 'replace')!r}, "
                            f"not {expected_model_hash!r}")
    actual_length = file_size - HEADER_SIZE
    if actual_length < payload_length:
        raise InvalidKVFile(f"truncated payload ({actual_length} of {payload_length} bytes)")
    if actual_length > payload_length:
        raise InvalidKVFile(f"{actual_length - payload_length} trailing bytes after the payload")
    return KVHeader(version=version, model_hash=expected_model_hash, payload_length=payload_length,
                    payload_digest=digest)


def validate_payload(header: KVHeader, payload: bytes) -> None:
    if len(payload) != header.payload_length:
        raise InvalidKVFile(f"truncated payload ({len(payload)} of {header.payload_length} bytes)")
    if payload_digest(payload, header.version) != header.payload_digest:
        raise InvalidKVFile("checksum mismatch (payload damaged)")
