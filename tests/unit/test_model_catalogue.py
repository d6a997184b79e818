"""Issue 60: the shipped model catalogue validates; a wrong entry is refused naming it; `pull` specs resolve to the
file a user means; the models folder lists verified .gguf files and never a partial download."""

from __future__ import annotations

import copy
import json

import pytest

from evoke_engine.models import CatalogueError, HubNotFoundError, ModelHubError, load_catalogue, local_models
from evoke_engine.models.catalogue import parse_catalogue, quant_of
from evoke_engine.models.download import destination, partial_path
from evoke_engine.models.errors import DiskSpaceError, format_bytes
from evoke_engine.models.hub import HubFile, PullSpec, RepoListing, choose_file, parse_spec
from evoke_engine.package_files import resources_root


def shipped() -> dict:
    return json.loads(resources_root().joinpath("model_catalogue.json").read_text(encoding="utf-8"))


def test_the_shipped_catalogue_validates_and_holds_the_coding_models_the_issue_names():
    catalogue = load_catalogue()
    assert catalogue.version == 1
    ids = {m.id for m in catalogue.models}
    for wanted in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-7b-instruct", "qwen2.5-coder-14b-instruct",
                   "qwen2.5-coder-32b-instruct", "qwen3-coder-30b-a3b-instruct", "deepseek-coder-v2-lite-instruct",
                   "codestral-22b"):
        assert wanted in ids
    assert any(m.has_fim and not m.chat for m in catalogue.models), "a small FIM model for completions"
    for model in catalogue.models:
        assert model.repo.count("/") == 1 and model.context_length >= 16384 and model.licence
        assert model.quant(model.default_quant) is not None
        assert all(q.file.endswith(".gguf") and q.size_bytes > 100_000_000 for q in model.quants)
        assert all(quant_of(q.file) == q.name for q in model.quants), model.id
        sizes = [q.size_bytes for q in model.quants]
        assert sizes == sorted(sizes), f"{model.id}: quants listed smallest first"


@pytest.mark.parametrize("change, message", [
    (lambda d: d["models"][0].pop("licence"), "missing field 'licence'"),
    (lambda d: d["models"][0].update(has_fim="yes"), "'has_fim' has the wrong type"),
    (lambda d: d["models"][0].update(context_length=True), "'context_length' has the wrong type"),
    (lambda d: d["models"][0].update(repo="not a repo"), "is not a Hugging Face id"),
    (lambda d: d["models"][0].update(default_quant="Q9_X"), "default_quant 'Q9_X'"),
    (lambda d: d["models"][0]["quants"][0].update(file="x.bin"), "a .gguf file"),
    (lambda d: d["models"][1].update(id=d["models"][0]["id"]), "two entries share an id"),
    (lambda d: d["models"][0].update(colour="red"), "unknown fields ['colour']"),
    (lambda d: d.update(version=99), "update Evoke Desk"),
])
def test_a_wrong_catalogue_is_refused_naming_the_entry_and_field(change, message):
    doc = copy.deepcopy(shipped())
    change(doc)
    with pytest.raises(CatalogueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_catalogue(json.dumps(doc))
    with pytest.raises(CatalogueError, match="not valid JSON"):
        parse_catalogue("{")


def test_quant_names_are_read_from_file_names():
    assert quant_of("Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("qwen2.5-coder-1.5b-q8_0.gguf") == "Q8_0"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("Qwen3-Coder-30B-A3B-Instruct-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"
    assert quant_of("Model-IQ4_XS-00001-of-00002.gguf") == "IQ4_XS"
    assert quant_of("model-f16.gguf") == "F16"
    assert quant_of("model.gguf") is None


def test_pull_specs_resolve_like_ollama_pull():
    catalogue = load_catalogue()
    assert parse_spec("qwen2.5-coder-7b-instruct", catalogue) == PullSpec(
        "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", quant="Q4_K_M")
    assert parse_spec("qwen2.5-coder-7b-instruct:Q8_0", catalogue).quant == "Q8_0"
    assert parse_spec("bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", catalogue).quant == "Q4_K_M"
    assert parse_spec("someone/Thing-GGUF", catalogue) == PullSpec("someone/Thing-GGUF")
    assert parse_spec("someone/Thing-GGUF:q5_k_m") == PullSpec("someone/Thing-GGUF", quant="q5_k_m")
    assert parse_spec("someone/Thing-GGUF:sub/Thing-Q4_0.gguf") == PullSpec("someone/Thing-GGUF",
                                                                              file="sub/Thing-Q4_0.gguf")
    with pytest.raises(ValueError, match="neither a catalogue id nor a repository"):
        parse_spec("no-such-model", catalogue)


def _listing(*names: str) -> RepoListing:
    from evoke_engine.models.hub import SPLIT_PART

    files = []
    for name in names:
        split = SPLIT_PART.search(name)
        files.append(HubFile(name, 1000, "ab" * 32, quant_of(name),
                             (int(split.group(1)), int(split.group(2))) if split else None))
    return RepoListing("o/r", "c" * 40, tuple(files))


def test_choose_file_by_quant_by_name_or_the_default_order():
    listing = _listing("M-Q2_K.gguf", "M-Q4_K_M.gguf", "M-Q8_0.gguf")
    assert choose_file(listing, PullSpec("o/r")).path == "M-Q4_K_M.gguf"
    assert choose_file(listing, PullSpec("o/r", quant="q8_0")).path == "M-Q8_0.gguf"
    assert choose_file(listing, PullSpec("o/r", file="M-Q2_K.gguf")).path == "M-Q2_K.gguf"
    assert choose_file(_listing("M-Q3_K_S.gguf"), PullSpec("o/r")).path == "M-Q3_K_S.gguf"
    with pytest.raises(HubNotFoundError, match="no Q5_K_M file; its quants: Q2_K, Q4_K_M, Q8_0"):
        choose_file(listing, PullSpec("o/r", quant="Q5_K_M"))
    with pytest.raises(HubNotFoundError, match="no file 'X.gguf'"):
        choose_file(listing, PullSpec("o/r", file="X.gguf"))
    with pytest.raises(HubNotFoundError, match="no GGUF files"):
        choose_file(_listing(), PullSpec("o/r"))
    with pytest.raises(ModelHubError, match="part 1 of a GGUF split in 2 files"):
        choose_file(_listing("M-Q8_0-00001-of-00002.gguf", "M-Q8_0-00002-of-00002.gguf"), PullSpec("o/r"))


def test_the_models_folder_lists_gguf_files_and_never_a_partial(tmp_path):
    folder = tmp_path / "models"
    done = destination(folder, "bartowski/Qwen2.5-Coder-7B-Instruct-GGUF", "Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf")
    other = destination(folder, "someone/Thing-GGUF", "Thing-Q5_K_M.gguf")
    part = partial_path(folder, "someone/Big-GGUF", "Big-Q4_K_M.gguf")
    for path in (done, other, part):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
    (folder / "notes.txt").write_text("x")
    assert part.name.endswith(".gguf.part") and ".partial" in part.parts
    found = local_models(folder, load_catalogue())
    assert [(m.path, m.catalogue_id, m.quant) for m in found] == [
        (done, "qwen2.5-coder-7b-instruct", "Q4_K_M"), (other, None, "Q5_K_M")]
    assert local_models(tmp_path / "absent") == []


def test_the_window_model_picker_does_not_show_a_partial_download_either(tmp_path):
    from app.model_finder import find_models

    part = partial_path(tmp_path, "someone/Big-GGUF", "Big-Q4_K_M.gguf")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"GGUF")
    (part.parent / "Big-Q4_K_M.gguf").write_bytes(b"GGUF")     # even a .gguf name inside .partial stays hidden
    assert [m.path for m in find_models(roots=[("Evoke Desk models", tmp_path)])] == [None]


def test_file_names_that_would_leave_the_models_folder_are_refused(tmp_path):
    for repo, name in (("o/r", "../evil.gguf"), ("o/r", "/etc/evil.gguf"), ("o/..", "x.gguf"),
                       ("o/r", ".partial/x.gguf")):
        with pytest.raises(ModelHubError, match="outside the models folder"):
            destination(tmp_path, repo, name)


def test_messages_say_sizes_as_people_read_them(tmp_path):
    assert format_bytes(512) == "512 B" and format_bytes(1536) == "1.5 KiB"
    assert format_bytes(5 * (1 << 30)) == "5.0 GiB"
    assert "needs 2.0 GiB, 1.0 GiB is free" in str(DiskSpaceError(tmp_path, 2 << 30, 1 << 30))
