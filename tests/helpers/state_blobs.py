"""One-sequence llama.cpp state blobs built in Python (the layout `llama_state_seq_get_data` writes), for tests of
code that walks or cuts them without a model."""

from __future__ import annotations

import struct

import numpy as np

N_LAYER, WIDTH = 3, 8


def state_blob(positions: list[int], k: np.ndarray, v: np.ndarray, *, v_trans: bool, k_type: int = 1,
               seqs: tuple[int, ...] = (3,)) -> bytearray:
    """A one-sequence state blob as llama_state_seq_get_data writes it; K, V: [layer, cell, bytes] uint8."""
    out = bytearray(struct.pack("<IIII", 0xA1B2, 2, 1, len(positions)))
    for pos in positions:
        out += struct.pack("<iI", pos, len(seqs)) + struct.pack(f"<{len(seqs)}i", *seqs)
    out += struct.pack("<II", int(v_trans), N_LAYER)
    for layer in range(N_LAYER):
        out += struct.pack("<iQ", k_type, k.shape[2]) + k[layer].tobytes()
    for layer in range(N_LAYER):
        if v_trans:                           # f16 elements: [n_embd_v, cell] of 2 bytes
            columns = v[layer].reshape(len(positions), -1, 2).transpose(1, 0, 2)
            out += struct.pack("<iII", 1, 2, columns.shape[0]) + columns.tobytes()
        else:
            out += struct.pack("<iQ", 1, v.shape[2]) + v[layer].tobytes()
    return out


def tensors(n_cells: int, seed: int, k_bytes: int = 2 * WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """Random K and V bytes [layer, cell, bytes] (any bytes: the walk and the cut never read values)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (N_LAYER, n_cells, k_bytes), dtype=np.uint8),
            rng.integers(0, 256, (N_LAYER, n_cells, 2 * WIDTH), dtype=np.uint8))
