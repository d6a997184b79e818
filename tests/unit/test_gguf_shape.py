"""Issue 60: a model's shape (layers, attention sizes, each layer's weight bytes) read from a GGUF's header, for the
fit before a load; the embedded model's and one written with gguf-py (a dev dependency), and broken files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evoke_engine.errors import ModelLoadError
from evoke_engine.runtime.gguf_shape import read_shape
from evoke_engine.runtime.model_file import default_model_path

pytestmark = pytest.mark.unit

MIB = 1 << 20


def test_shape_of_the_embedded_model_from_its_header():
    """SmolLM2-135M: 30 llama layers, 576 wide, 9 heads over 3 KV heads, tied embeddings (llama.cpp copies
    token_embd to the output device)."""
    path = default_model_path()
    shape = read_shape(path)
    assert (shape.architecture, shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv, shape.n_ff,
            shape.n_vocab, shape.n_ctx_train) == ("llama", 30, 576, 9, 3, 1536, 49152, 8192)
    assert len(set(shape.layer_bytes)) == 1 and shape.layer_bytes[0] > 0
    assert shape.output_bytes == shape.input_bytes + 576 * 4                        # the copy and output_norm (f32)
    data = shape.weight_bytes - shape.input_bytes                                    # the file holds one copy
    assert 0 < path.stat().st_size - data < 4 * MIB                                  # the header and the padding


def test_shape_of_a_written_gguf_with_an_output_matrix(tmp_path: Path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_context_length(4096)
    writer.add_token_list([f"t{i}".encode() for i in range(2000)])                  # longer than an array kept
    writer.add_tensor("token_embd.weight", np.zeros((2000, 64), np.float16))
    writer.add_tensor("output.weight", np.zeros((2000, 64), np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(64, np.float32))
    for layer in range(2):
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.zeros((64, 64), np.float16))
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", np.zeros((128, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = read_shape(path)
    assert (shape.architecture, shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv, shape.n_vocab) == (
        "qwen2", 2, 64, 4, 2, 2000)
    assert shape.layer_bytes == (64 * 64 * 2 + 128 * 64 * 4,) * 2
    assert shape.output_bytes == 2000 * 64 * 4 + 64 * 4 and shape.input_bytes == 2000 * 64 * 2


def test_not_a_gguf_is_a_readable_error(tmp_path: Path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ModelLoadError, match="not a readable GGUF header"):
        read_shape(bad)
    truncated = tmp_path / "short.gguf"
    truncated.write_bytes(default_model_path().read_bytes()[:5000])
    with pytest.raises(ModelLoadError):
        read_shape(truncated)
