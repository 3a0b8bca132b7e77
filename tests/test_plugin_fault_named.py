"""A third-party plugin's own bug, an ordinary exception out of its code during `hloforge train`, is said in
one line naming the plugin (kind, name, distribution), the exception, and that the bug is the plugin's, not
hloforge's (its traceback in a file, or printed under HLOFORGE_DEBUG=1), where it once read as hloforge's
anonymous "internal error". A built-in's failure still is hloforge's internal error, and a user mistake a
plugin refuses with an HloforgeError stays its own line.

The "pip-installed" distribution is a module and a dist-info on sys.path (as in
tests/test_plugins_ecosystem.py), found by a default registry built afresh for each test.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from plugin_site import fake_dist, installed_in_process

from hloforge.cli import main
from hloforge.core.registry import Registry

DIST = "hloforge-buggy"

BUGGY = textwrap.dedent('''
    """One plugin of each kind, each with a bug of its own author's."""
    from typing import ClassVar

    import attrs
    import numpy as np

    from hloforge.callbacks import Callback
    from hloforge.core.errors import UnsupportedSpec
    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer, Loss
    from hloforge.core.variant import Optimizer

    SCALES = {}
    HOOK = {"raise": False}


    def reciprocal(n):  # a helper of the module, called from a component's method
        return 1.0 / n


    @attrs.frozen
    class Lookup(Layer):
        kind = "lookupScale"

        def out_shape(self, in_shape):
            return in_shape

        def forward(self, b, x, params, ctx):
            return x * SCALES["scale"]


    @attrs.frozen
    class LookupTwice(Lookup):
        kind = "lookupTwice"  # Lookup's forward, inherited: named as itself, not as Lookup


    @attrs.frozen
    class Picky(Lookup):
        kind = "picky"

        def out_shape(self, in_shape):
            raise UnsupportedSpec("picky: my own refusal of this input")


    @attrs.frozen
    class Lazy(Layer):
        kind = "lazy"  # its forward left out: the contract's NotImplementedError

        def out_shape(self, in_shape):
            return in_shape


    @attrs.frozen
    class Empty(Loss):
        name = "empty"

        def label_spec(self, out_shape):
            return (), "i32"

        def forward(self, b, logits, y):
            return b.sum(logits) * reciprocal(0)


    @attrs.frozen
    class Forgetful(Optimizer):
        name: ClassVar[str] = "forgetful"
        state: ClassVar[tuple[str, ...]] = ()

        def direction(self, b, g, state, scalars):
            return g * state["m"], {}


    class Blobs:
        name = "blobs"
        num_classes = 3

        def __init__(self, singular: int = 0):
            self.singular = singular

        def arrays(self, split):
            if self.singular:  # numpy raises, inside numpy: still the plugin's call
                np.linalg.inv(np.zeros((2, 2)))
            rng = np.random.default_rng(0 if split == "train" else 1)
            y = rng.integers(0, 3, 64).astype(np.int32)
            return (rng.standard_normal((64, 2)) + y[:, None]).astype(np.float32), y


    class Fussy(Callback):
        name = "fussy"

        def on_epoch_end(self, epoch, logs):
            logs["no such metric"]


    class Fragile:
        name = "fragile"

        def __init__(self):
            from hloforge.backends.xla.backend import XlaBackend

            self.inner = XlaBackend()

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def compile(self, mlir_text, num_replicas=1):
            raise RuntimeError("compiler crashed")


    @hookimpl
    def hloforge_layers():
        return [Lookup, LookupTwice, Picky, Lazy]


    @hookimpl
    def hloforge_losses():
        return [Empty]


    @hookimpl
    def hloforge_optimizers():
        return [Forgetful]


    @hookimpl
    def hloforge_datasets():
        return [Blobs]


    @hookimpl
    def hloforge_callbacks():
        return [Fussy]


    @hookimpl
    def hloforge_backends():
        return [Fragile]


    @hookimpl
    def hloforge_on_epoch_end(run, epoch, metrics):
        if HOOK["raise"]:
            raise ValueError("my epoch hook broke")
''')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("buggy")
    groups = ("layers", "losses", "optimizers", "datasets", "callbacks", "backends")
    fake_dist(site, DIST, {"hf_buggy": BUGGY}, {f"hloforge.{g}": {"buggy": "hf_buggy"} for g in groups})
    return site


@pytest.fixture
def installed(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """hloforge-buggy installed; the default registry built afresh with it, and dropped after the test."""
    yield from installed_in_process(site, tmp_path, monkeypatch)


def net(tmp_path: Path, *extra: str) -> str:
    path = tmp_path / "net.toml"
    path.write_text('name = "blobnet"\ninput_shape = [2]\nnum_classes = 3\n'
                    + "".join(f'\n[[layers]]\nkind = "{k}"\n' for k in extra)
                    + '\n[[layers]]\nkind = "dense"\nunits = 3\n')
    return str(path)


def train(tmp_path: Path, *args: str, layers: tuple[str, ...] = (), run: str = "run") -> list[str]:
    return ["train", net(tmp_path, *layers), "--data", "blobs", "--epochs", "1", "--batch", "16", "--no-progress",
            "--run-dir", str(tmp_path / run), *args]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


BUG = " (a bug in that plugin, not in hloforge: tell its authors; the full traceback is in "


@pytest.mark.parametrize(("args", "layers", "said"), [
    ((), ("lookupScale",), "layer 'lookupScale' (dist 'hloforge-buggy') failed: KeyError: 'scale'"),
    ((), ("lookupTwice",), "layer 'lookupTwice' (dist 'hloforge-buggy') failed: KeyError: 'scale'"),
    (("--loss", "empty"), (), "loss 'empty' (dist 'hloforge-buggy') failed: ZeroDivisionError: float division by zero"),
    (("--optimizer", "forgetful"), (), "optimizer 'forgetful' (dist 'hloforge-buggy') failed: KeyError: 'm'"),
    (("--data-opt", "singular=1"), (), "dataset 'blobs' (dist 'hloforge-buggy') failed: LinAlgError: Singular matrix"),
    (("--backend", "fragile"), (), "backend 'fragile' (dist 'hloforge-buggy') failed: RuntimeError: compiler crashed"),
    ((), ("lazy",), "layer 'lazy' (dist 'hloforge-buggy') does not implement forward"),
])
def test_a_plugins_bug_names_the_plugin(args: tuple[str, ...], layers: tuple[str, ...], said: str, installed: None,
                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, *args, layers=layers)) == 4
    err = one_line(capsys)
    assert err.startswith(f"hloforge: plugin error: {said}{BUG}"), err
    assert "internal error" not in err
    path = Path(err.split("the full traceback is in ")[1].split(",")[0])
    assert path.parent == tmp_path / "cache" / "tracebacks" and "Traceback" in path.read_text()


def test_a_callbacks_and_a_hooks_bug_after_an_epoch_name_them(installed: None, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(train(tmp_path, "--callback", "fussy")) == 4
    assert one_line(capsys).startswith("hloforge: plugin error: callback 'fussy' (dist 'hloforge-buggy') failed: "
                                       f"KeyError: 'no such metric'{BUG}")
    import hf_buggy

    monkeypatch.setitem(hf_buggy.HOOK, "raise", True)
    assert main(train(tmp_path, run="again")) == 4
    assert one_line(capsys).startswith("hloforge: plugin error: hook 'hloforge_on_epoch_end' (dist 'hloforge-buggy') "
                                       f"failed: ValueError: my epoch hook broke{BUG}")


def test_debug_prints_the_traceback_then_the_plugins_line(installed: None, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HLOFORGE_DEBUG", "1")
    assert main(train(tmp_path, layers=("lookupScale",))) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback (most recent call last):" in err and 'return x * SCALES["scale"]' in "\n".join(err)
    assert err[-1] == ("hloforge: plugin error: layer 'lookupScale' (dist 'hloforge-buggy') failed: KeyError: 'scale' "
                       "(a bug in that plugin, not in hloforge: tell its authors)")


def test_a_plugins_own_refusal_stays_its_line(installed: None, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(train(tmp_path, layers=("picky",))) == 3
    err = one_line(capsys)
    assert err.startswith("hloforge: error: ") and "picky: my own refusal of this input" in err, err
    assert "plugin error" not in err and "a bug" not in err


def test_a_builtins_failure_is_still_hloforges_internal_error(installed: None, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside a loaded third-party plugin (its layer in the net), hloforge's dense failing is hloforge's bug."""
    from hloforge.core.registry import default_registry

    monkeypatch.setitem(__import__("hf_buggy").SCALES, "scale", 2.0)
    dense = default_registry().get("layer", "dense")
    monkeypatch.setattr(dense, "forward", lambda *a, **k: {}["w"])
    assert main(train(tmp_path, layers=("lookupScale",))) == 4
    err = one_line(capsys)
    assert err.startswith("hloforge: internal error: KeyError: 'w' (a bug; the full traceback is in "), err
    assert "plugin" not in err


def test_code_of_a_plugins_module_no_component_ran_names_the_module(site: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    import hf_buggy

    reg = Registry(extra_plugins=((hf_buggy, DIST),))
    with pytest.raises(ZeroDivisionError) as raised:
        hf_buggy.reciprocal(0)
    found = reg.at_fault(raised.value)
    assert found is not None and (found.kind, found.name, found.distribution) == ("module", "hf_buggy", DIST)
    with pytest.raises(KeyError) as raised:
        {}["x"]  # noqa: B018 - code of no plugin's: nobody's to name
    assert reg.at_fault(raised.value) is None
