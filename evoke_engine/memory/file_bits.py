"""KV files at fewer bits (`kv_file_bits`): a snapshot's slot image and its full-width saved blocks packed in the
pool's 8-bit format (kvquant) for the file, and the image unpacked again when the file is read.

Invariants: `unpack_image(pack_for_file(s, bits))` gives a snapshot `snapshot_fit` accepts (the image full width,
every byte outside the K/V data unchanged, each value within half a step); a snapshot whose image was packed is no
longer `exact` (its cells are near a fresh decode, not equal: chunk reuse skips them); blobs kvquant does not cover
(a q8_0 cache) and blocks the pool already packed are kept as they are; 16 bits changes nothing.
"""

from __future__ import annotations

import dataclasses

from ..kvcache import kvquant
from .snapshot import Snapshot
from .snapshot_check import SnapshotError


def pack_for_file(snapshot: Snapshot, bits: int) -> Snapshot:
    """The snapshot as the file holds it at `bits` (16: itself)."""
    if bits >= 16:
        return snapshot
    image = snapshot.image
    packed_image = kvquant.pack(image[0], bits) if image is not None else None
    saved = {}
    for index, (data, origin, n_tokens) in snapshot.saved.items():
        packed = None if kvquant.is_packed(data) else kvquant.pack(data, bits)
        saved[index] = (data if packed is None else packed, origin, n_tokens)
    if packed_image is None:
        return dataclasses.replace(snapshot, saved=saved)
    return dataclasses.replace(snapshot, image=(packed_image, image[1], image[2]), saved=saved, exact=False)


def unpack_image(snapshot: Snapshot) -> Snapshot:
    """The snapshot with its image back at full width (it is restored into a slot as llama.cpp state bytes);
    SnapshotError when the packed image does not fit (the file is then rejected and the history rebuilt)."""
    image = snapshot.image
    if image is None or not kvquant.is_packed(image[0]):
        return snapshot
    try:
        full = kvquant.unpack(image[0])
    except kvquant.UnfitPacked as exc:
        raise SnapshotError(f"packed slot image does not fit ({exc})") from exc
    return dataclasses.replace(snapshot, image=(full, image[1], image[2]))
