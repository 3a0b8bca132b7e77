"""`import-weights --out FILE.safetensors`: written whole through a temp file, and a place it cannot write is
one line. Before: safetensors' own SafetensorError (an internal error) for a directory it could not write, and
"[Errno 17] File exists" for an --out under a file."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from hloforge.core.errors import HloforgeError
from hloforge.interop.importer import Imported, write_weights
from hloforge.train import checkpoint
from hloforge.zoo import get_net


def _imported() -> Imported:
    spec = get_net("mnist-linear")
    return Imported("torchvision:none", spec, spec.init_params(0), [s.initial() for _, s in spec.stats()])


def test_weights_are_written_whole_and_read_back(tmp_path) -> None:
    imp = _imported()
    out = str(tmp_path / "sub" / "w.safetensors")
    assert write_weights(imp, out) == out
    from safetensors.numpy import load_file

    tensors = load_file(out)
    for (name, _), p in zip(imp.spec.params(), imp.params, strict=True):
        np.testing.assert_array_equal(tensors[f"param/{name}"], p)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["w.safetensors"]  # no temp file left


def test_an_out_under_a_file_or_in_a_directory_it_cannot_write_is_one_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(HloforgeError) as error:
        write_weights(_imported(), str(tmp_path / "afile" / "w.safetensors"))
    assert str(error.value).startswith(f"--out's directory {tmp_path / 'afile'} is a file, where a directory was "
                                       "expected")

    def refused(path, *args, **kwargs):  # the run as root writes anywhere: the kernel's answer, made here
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(checkpoint, "open", refused, raising=False)
    out = tmp_path / "ro" / "w.safetensors"
    (tmp_path / "ro").mkdir()
    with pytest.raises(HloforgeError) as error:
        write_weights(_imported(), str(out))
    said = str(error.value)
    assert said == (f"could not write weights file {out}: Permission denied (there was no weights file before, the "
                    f"temp file removed); expected a directory this user can write ({tmp_path / 'ro'} is not)")
    assert not out.exists()


def test_a_full_disk_leaves_no_directory_it_made_on_the_way(tmp_path, monkeypatch) -> None:
    """`import-weights ... --out some/new/dir/w.safetensors` (or a run directory --out some/new/run) on a full
    disk: the write was undone, but some/new/dir (some/new) it had made stayed behind. All or nothing: gone too."""
    from hloforge.interop.exporter import write_whole

    (tmp_path / "mine").mkdir()

    def full(fd: int) -> None:  # the disk fills as the data is forced out
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", full)
    with pytest.raises(HloforgeError, match="No space left on device"):
        write_weights(_imported(), str(tmp_path / "some" / "new" / "dir" / "w.safetensors"))
    with pytest.raises(HloforgeError, match="No space left on device"):
        write_whole(str(tmp_path / "mine" / "new" / "run"), [(str(tmp_path / "mine" / "new" / "run" / "f"), b"x", "f")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and not list((tmp_path / "mine").iterdir())
