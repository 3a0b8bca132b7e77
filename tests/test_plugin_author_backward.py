"""A third-party layer's closed-form backward (`Builder.custom_vjp`) or forward, or a loss's `label_spec`, that
breaks its contract is refused in one line naming the plugin (kind, name, distribution), what it gave and what
was expected. Before, a bwd returning fewer cotangents than inputs trained with that input silently frozen (a
plausible wrong number), one returning too many passed; a wrong-shaped cotangent, a bare Value or a forward in
the wrong element type ended as hloforge's internal error or blamed the next, built-in, layer; a label dtype
"float32" was written into the module.

The "pip-installed" distribution is a module and a dist-info on sys.path (tests/plugin_site.py), found by a
default registry built afresh for each test.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from plugin_site import fake_dist, installed_in_process

from hloforge.cli import main

DIST = "hloforge-backward"

MODULE = textwrap.dedent('''
    """Layers whose custom_vjp or forward breaks its contract, and losses whose label_spec does."""
    import attrs
    import numpy as np

    from hloforge.core.hookspecs import hookimpl
    from hloforge.core.spec import Layer, Loss, ParamSlot


    @attrs.frozen
    class Scaled(Layer):
        """y = x * s, differentiated by a closed-form bwd(b, g) -> [dx, ds] (BWD below)."""
        kind = "scaled"

        def out_shape(self, in_shape):
            return in_shape

        def param_slots(self, in_shape):
            return (ParamSlot("s", (in_shape[0],), "ones", False),)

        def forward(self, b, x, params, ctx):
            sb = b.broadcast_in_dim(params["s"], x.shape, [1])

            def fwd(x, sb):
                return [x * sb]

            def bwd(b, g):
                return self.cotangents(b, g, x, sb)
            return b.custom_vjp(fwd, bwd, x, sb)[0]

        def cotangents(self, b, g, x, sb):
            return [g * sb, g * x]

        def reference(self, params, x, ctx):
            return x * params["s"]


    @attrs.frozen
    class Short(Scaled):
        kind = "bwdShort"

        def cotangents(self, b, g, x, sb):
            return [g * sb]  # ds forgotten: s would never train


    @attrs.frozen
    class Long(Scaled):
        kind = "bwdLong"

        def cotangents(self, b, g, x, sb):
            return [g * sb, g * x, g]


    @attrs.frozen
    class Shape(Scaled):
        kind = "bwdShape"

        def cotangents(self, b, g, x, sb):
            return [b.sum(g, [1]), g * x]


    @attrs.frozen
    class Dtype(Scaled):
        kind = "bwdDtype"

        def cotangents(self, b, g, x, sb):
            return [g * sb, b.convert(g * x, "f64")]


    @attrs.frozen
    class Bare(Scaled):
        kind = "bwdBare"

        def cotangents(self, b, g, x, sb):
            return g * sb  # one Value, not a list


    @attrs.frozen
    class NoScaleGrad(Scaled):
        kind = "bwdNone"

        def cotangents(self, b, g, x, sb):
            return [g * sb, None]  # the contract: None is no gradient


    @attrs.frozen
    class FwdBare(Layer):
        kind = "fwdBare"

        def out_shape(self, in_shape):
            return in_shape

        def forward(self, b, x, params, ctx):
            return b.custom_vjp(lambda x: x * 2.0, lambda b, g: [g * 2.0], x)[0]  # fwd gives no list


    @attrs.frozen
    class Twice(Layer):
        kind = "twice"
        dtype: str = "f32"

        def out_shape(self, in_shape):
            return in_shape

        def forward(self, b, x, params, ctx):
            return b.convert(x * 2.0, self.dtype) if self.dtype != b.dtype else x * 2.0

        def reference(self, params, x, ctx):
            return 2.0 * x


    @attrs.frozen
    class ToF64(Twice):
        kind = "fwdF64"
        dtype: str = "f64"

        @classmethod
        def gate_cases(cls):
            return [(cls(), (3,))]


    @attrs.frozen
    class ToI32(Twice):
        kind = "fwdI32"
        dtype: str = "i32"


    @attrs.frozen
    class Targets(Loss):
        name = "targets"
        spec = ((3,), "f32")

        def label_spec(self, out_shape):
            return self.spec

        def forward(self, b, logits, y):
            d = logits - y
            return b.sum(d * d) / float(logits.type.size)


    @attrs.frozen
    class DtypeTypo(Targets):
        name = "dtypeTypo"
        spec = ((3,), "float32")


    @attrs.frozen
    class ShapeOnly(Targets):
        name = "shapeOnly"
        spec = (3,)


    @attrs.frozen
    class ZeroWide(Targets):
        name = "zeroWide"
        spec = ((0,), "i32")


    class Blobs:
        name = "blobs3"
        num_classes = 3

        def arrays(self, split):
            rng = np.random.default_rng(0 if split == "train" else 1)
            y = rng.integers(0, 3, 64).astype(np.int32)
            return (rng.standard_normal((64, 3)) + y[:, None]).astype(np.float32), y


    @hookimpl
    def hloforge_layers():
        return [Scaled, Short, Long, Shape, Dtype, Bare, NoScaleGrad, FwdBare, Twice, ToF64, ToI32]


    @hookimpl
    def hloforge_losses():
        return [Targets, DtypeTypo, ShapeOnly, ZeroWide]


    @hookimpl
    def hloforge_datasets():
        return [Blobs]
''')


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("backward")
    fake_dist(site, DIST, {"hf_backward": MODULE},
              {f"hloforge.{g}": {"bw": "hf_backward"} for g in ("layers", "losses", "datasets")})
    return site


@pytest.fixture
def installed(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yield from installed_in_process(site, tmp_path, monkeypatch)


def net(tmp_path: Path, kind: str) -> str:
    path = tmp_path / "net.toml"
    path.write_text(f'name = "n"\ninput_shape = [3]\nnum_classes = 3\n\n[[layers]]\nkind = "{kind}"\n'
                    '\n[[layers]]\nkind = "dense"\nunits = 3\n')
    return str(path)


def render(tmp_path: Path, kind: str, *args: str) -> list[str]:
    return ["render", net(tmp_path, kind), "--batch", "4", "--out", str(tmp_path / "out"), *args]


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    return err


BACKWARD = f"hloforge: error: layer '{{}}' (dist '{DIST}'): layer 0's backward: custom_vjp's bwd returned "
FORWARD = f"hloforge: error: layer '{{}}' (dist '{DIST}'): layer 0's forward"


@pytest.mark.parametrize(("kind", "said"), [
    ("bwdShort", "1 cotangent for its 2 inputs, expected one per input, in order (None for no gradient)"),
    ("bwdLong", "3 cotangents for its 2 inputs, expected one per input, in order (None for no gradient)"),
    ("bwdShape", "tensor<4xf32> for input 0, expected tensor<4x3xf32> (that input's type) or None"),
    ("bwdDtype", "tensor<4x3xf64> for input 1, expected tensor<4x3xf32> (that input's type) or None"),
    ("bwdBare", "tensor<4x3xf32>, expected a list of one cotangent per input (2; None for no gradient)"),
])
def test_a_custom_bwd_off_its_contract_is_refused_naming_the_layer(kind: str, said: str, installed: None,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(render(tmp_path, kind)) == 3
    assert refusal(capsys) == BACKWARD.format(kind) + said
    assert not list((tmp_path / "out").glob("*train_step*"))


def test_a_short_bwd_trains_nothing(installed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sweep's case: `train` once ran with the forgotten input's gradient zero, its parameter frozen."""
    assert main(["train", net(tmp_path, "bwdShort"), "--data", "blobs3", "--epochs", "1", "--batch", "16",
                 "--no-progress", "--run-dir", str(tmp_path / "run")]) == 3
    assert refusal(capsys).startswith(BACKWARD.format("bwdShort") + "1 cotangent for its 2 inputs")


def test_none_for_an_input_with_no_gradient_still_renders(installed: None, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(render(tmp_path, "bwdNone")) == 0
    (step,) = (tmp_path / "out").glob("*train_step.mlir")
    assert "func.func public @main" in step.read_text()


def test_a_custom_fwd_giving_no_list_is_refused_naming_the_layer(installed: None, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(render(tmp_path, "fwdBare")) == 3
    assert refusal(capsys) == FORWARD.format("fwdBare") + (": custom_vjp's fwd returned tensor<4x3xf32>, expected "
                                                           "a list of the builder values of its outputs")


@pytest.mark.parametrize(("kind", "dtype"), [("fwdF64", "f64"), ("fwdI32", "i32")])
def test_a_forward_in_another_element_type_names_that_layer(kind: str, dtype: str, installed: None, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Once blamed on the next layer: `layer 'dense' (dist 'hloforge'): … operands differ`."""
    assert main(render(tmp_path, kind)) == 3
    assert refusal(capsys) == FORWARD.format(kind) + (f" emitted tensor<4x3x{dtype}>, expected the module's "
                                                      "element type f32 (its input's)")


def test_the_gate_fails_a_forward_in_f64_though_its_f64_render_is_right(installed: None,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The gate renders in f64 (where f64 is the module's type) and in f32: the f32 render refuses it."""
    assert main(["verify", "fwdF64"]) == 1
    out = capsys.readouterr().out
    assert "emitted tensor<2x3xf64>, expected the module's element type f32" in out, out


@pytest.mark.parametrize(("loss", "got"), [
    ("dtypeTypo", "((3,), 'float32')"), ("shapeOnly", "(3,)"), ("zeroWide", "((0,), 'i32')")])
def test_a_label_spec_off_its_contract_is_refused_naming_the_loss(loss: str, got: str, installed: None,
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(render(tmp_path, "twice", "--loss", loss)) == 3
    assert refusal(capsys) == (f"hloforge: error: loss '{loss}' (dist '{DIST}'): label_spec((3,)) returned {got}, "
                               "expected (the per-example label shape as a tuple of positive ints, 'i32' or 'f32')")
    assert not list((tmp_path / "out").glob("*.mlir"))


@pytest.mark.parametrize(("loss", "got"), [("dtypeTypo", "((3,), 'float32')"), ("shapeOnly", "(3,)")])
def test_train_refuses_a_label_spec_off_its_contract(loss: str, got: str, installed: None,
                                                      tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`train` reads the loss's labels to match them to the dataset's (train/tasks.py) before any render."""
    assert main(["train", net(tmp_path, "twice"), "--data", "blobs3", "--loss", loss, "--epochs", "1", "--batch",
                 "16", "--no-progress", "--run-dir", str(tmp_path / "run")]) == 3
    assert refusal(capsys) == (f"hloforge: error: loss '{loss}' (dist '{DIST}'): label_spec((3,)) returned {got}, "
                               "expected (the per-example label shape as a tuple of positive ints, 'i32' or 'f32')")


def test_a_good_label_spec_still_renders(installed: None, tmp_path: Path) -> None:
    assert main(render(tmp_path, "twice", "--loss", "targets")) == 0
    (step,) = (tmp_path / "out").glob("*train_step.mlir")
    assert "tensor<4x3xf32>" in step.read_text()
