"""Which sentence-transformers pipelines the ONNX encoder runs (`onnx_encoder.supported`): an encoder, mean pooling
and unit length, nothing else; and a model folder's fingerprint follows its content."""

from __future__ import annotations

from evoke_engine.memory import onnx_encoder


class Transformer:
    pass


class Normalize:
    pass


class Dense:
    pass


class Pooling:
    def __init__(self, **config) -> None:
        self.config = config

    def get_config_dict(self) -> dict:
        return self.config


def test_encoder_mean_pooling_and_normalize_are_run():
    assert onnx_encoder.supported([Transformer(), Pooling(pooling_mode="mean"), Normalize()])
    assert onnx_encoder.supported([Transformer(), Pooling(pooling_mode_mean_tokens=True), Normalize()])


def test_other_pipelines_stay_on_sentence_transformers():
    assert not onnx_encoder.supported([Transformer(), Pooling(pooling_mode="cls"), Normalize()])
    assert not onnx_encoder.supported([Transformer(), Pooling(pooling_mode="mean")])                # not unit length
    assert not onnx_encoder.supported([Transformer(), Pooling(pooling_mode="mean"), Normalize(), Dense()])
    assert not onnx_encoder.supported([Transformer(), Pooling(pooling_mode="mean", include_prompt=False),
                                       Normalize()])


def test_the_fingerprint_follows_the_folder_content(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x00" * 10)
    first = onnx_encoder.fingerprint(tmp_path)
    assert onnx_encoder.fingerprint(tmp_path) == first
    (tmp_path / "sub" / "weights.bin").write_bytes(b"\x00" * 9 + b"\x01")
    assert onnx_encoder.fingerprint(tmp_path) != first


def test_a_new_export_removes_only_the_exports_of_older_formats(tmp_path):
    current, older = onnx_encoder.FORMAT, onnx_encoder.FORMAT - 1
    names = [f"{older}-abc.onnx", f"{older}-abc.json", f"{older}-abc.tokenizer.json", f"{older}-abc.onnx.lock",
             f"{current}-abc.onnx", f"{current}-def.json", "notes-1.txt", "x.onnx"]
    for name in names:
        (tmp_path / name).write_text("x")
    removed = onnx_encoder.prune_older_formats(tmp_path)
    assert sorted(removed) == sorted(names[:4])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[4:])
