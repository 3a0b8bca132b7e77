"""How a run is named and found: the default run directory after the last one that holds a
checkpoint (one deleted between others included), a tag that stays a name under runs/, and a net
given as a path that does not name a readable spec file."""

from __future__ import annotations

import os

import pytest

from hloforge.core.errors import UnsupportedSpec
from hloforge.train.config import CHECKPOINT, TrainConfig
from hloforge.zoo import get_net


def test_a_new_run_goes_after_the_last_checkpointed_directory_and_a_resume_to_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, spec = TrainConfig(backend="xla"), get_net("mnist-mlp")
    base = cfg.resolved_run_dir(spec)
    assert base == os.path.join("runs", cfg.scope(spec))
    for d in (base, f"{base}_3"):  # _2 deleted, or never finished
        os.makedirs(d)
        open(os.path.join(d, CHECKPOINT), "wb").close()
    os.makedirs(f"{base}_2")
    assert cfg.resolved_run_dir(spec) == f"{base}_4"
    assert cfg.resolved_run_dir(spec, resume=True) == f"{base}_3"


@pytest.mark.parametrize("tag", ["../../x", "a/b", "a\\b", ".hidden", "nul\0"])
def test_a_tag_that_would_leave_runs_or_hide_is_refused(tag):
    with pytest.raises(UnsupportedSpec, match="expected a name without"):
        TrainConfig(tag=tag)
    assert TrainConfig(tag="lr-0.01 b ü").tag == "lr-0.01 b ü"


def test_a_net_given_as_a_path_says_what_is_wrong_with_the_path(tmp_path):
    with pytest.raises(UnsupportedSpec, match="spec file '.*nofile.toml' does not exist"):
        get_net(os.path.join(tmp_path, "nofile.toml"))
    for name in ("net.yaml", os.path.join("specs", "net")):
        with pytest.raises(UnsupportedSpec, match="a spec file must end in .toml or .json"):
            get_net(name)
    with pytest.raises(UnsupportedSpec, match="unknown net 'resnet9'"):
        get_net("resnet9")
