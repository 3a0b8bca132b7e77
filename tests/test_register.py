"""`hf.register`: a layer, loss or optimizer written in the user's own program, gated, then used by its name; a
net of a class not registered refused; a saved model of one reopened where its program registers it again."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import pytest
from plugin_site import env_with

import hloforge as hf
from hloforge.core.errors import DataError, PluginError
from hloforge.core.hlo import Builder, Value
from hloforge.core.registry import NameClash, Registry, default_registry
from hloforge.core.spec import Ctx, Layer, Loss, ParamSlot, Shape


@pytest.fixture(autouse=True)
def own_registry() -> Iterator[None]:
    """Each test registers into a registry of its own: what it adds is gone for the other tests."""
    default_registry.cache_clear()
    yield
    default_registry.cache_clear()


# The layer's class, as a program writes it: its source also runs as another program's own (`__main__`) below.
@attrs.frozen
class ChannelScale(Layer):
    """y = s·x per feature."""

    kind = "channelScale"

    def out_shape(self, in_shape: Shape) -> Shape:
        return in_shape

    def param_slots(self, in_shape: Shape) -> tuple[ParamSlot, ...]:
        return (ParamSlot("s", (in_shape[0],), "ones", False),)

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return x * b.broadcast_in_dim(params["s"], x.shape, [1])

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        return x * params["s"]

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (3,))]


SCALE = inspect.getsource(ChannelScale)


@attrs.frozen
class WrongSoftsign(Layer):
    """x / (1 + |x|) with a closed-form backward that forgets the square: its gate must go red."""

    kind = "wrongSoftsign"

    def out_shape(self, in_shape: Shape) -> Shape:
        return in_shape

    def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
        return b.custom_vjp(lambda x: [x / (b.abs(x) + 1.0)], lambda b, g: [g / (b.abs(x) + 1.0)], x)[0]

    def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
        import jax.numpy as jnp

        return x / (1 + jnp.abs(x))

    @classmethod
    def gate_cases(cls) -> list[tuple[Layer, Shape]]:
        return [(cls(), (5,))]


@attrs.frozen
class HalfSquared(Loss):
    """mean over the batch of ½‖z − onehot(y)‖²."""

    name = "halfSquared"

    def label_spec(self, out_shape: Shape) -> tuple[Shape, str]:
        return (), "i32"

    def forward(self, b: Builder, logits: Value, y: Value) -> Value:
        n, c = logits.shape
        onehot = b.convert(b.compare(b.broadcast_in_dim(y, (n, c), [0]), b.iota((n, c), 1, y.dtype), "EQ"),
                           logits.dtype)
        d = logits - onehot
        return b.sum(d * d) * (0.5 / n)

    def reference(self, logits: Any, y: Any) -> Any:
        import jax
        import jax.numpy as jnp

        d = logits - jax.nn.one_hot(y, logits.shape[1], dtype=logits.dtype)
        return 0.5 * jnp.mean(jnp.sum(d * d, axis=1))

    def sample_labels(self, rng: np.random.Generator, batch: int, out_shape: Shape) -> np.ndarray:
        return rng.integers(0, out_shape[0], batch).astype(np.int32)

    @classmethod
    def gate_cases(cls) -> list[tuple[Loss, Shape]]:
        return [(cls(), (4,))]


def digits() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((128, 8), dtype=np.float32), rng.integers(0, 3, 128)


def test_a_layer_of_the_programs_own_is_gated_trains_and_reopens() -> None:
    assert hf.register(ChannelScale) is ChannelScale  # so `@hf.register` decorates the class
    assert hf.layers["channelScale"] is ChannelScale and hf.layers.ChannelScale is ChannelScale
    x, y = digits()
    m = hf.Model(hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3), seed=0)
    history = m.fit(x, y, epochs=3, batch_size=32, verbose=False)
    assert history["loss"][-1] < history["loss"][0]
    assert not np.allclose(m.params["0.s"], 1.0)  # its own parameter trained


def test_a_layer_not_registered_is_refused_when_a_model_is_made() -> None:
    """Before: it trained, ungated, and `save` then failed reading its own checkpoint back."""
    net = hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3)
    with pytest.raises(PluginError, match=r"^net 'scaled': layer 0 is test_register\.ChannelScale, which is not "
                                          r"registered .*; hf\.register\(ChannelScale\) gates it and makes it known$"):
        hf.Model(net)


def test_a_model_unpickled_where_its_layer_is_not_registered_is_refused() -> None:
    """Before: it trained ungated, and saved a checkpoint without the class's record, which `hf.load` then refused
    as an unknown layer among every built-in one."""
    import pickle

    hf.register(ChannelScale)
    pickled = pickle.dumps(hf.Model(hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3), seed=0))
    default_registry.cache_clear()  # a program that has not registered it
    with pytest.raises(PluginError, match=r"^net 'scaled': layer 0 is test_register\.ChannelScale, which is not "
                                          r"registered .*; hf\.register\(ChannelScale\) gates it and makes it known$"):
        pickle.loads(pickled)
    hf.register(ChannelScale)
    assert pickle.loads(pickled).spec.layers[0] == ChannelScale()


def test_a_class_under_a_built_in_kind_is_refused() -> None:
    """A subclass of hloforge's Dense keeping kind 'dense' would save as 'dense' and reopen as hloforge's."""
    class Dense(hf.layers.Dense):  # type: ignore[misc, name-defined]
        pass

    with pytest.raises(PluginError, match=r"layer 0 is .*Dense, but its kind 'dense' is "
                                          r"hloforge\.plugins\.layers\.dense\.Dense's \(distribution 'hloforge'\); "
                                          r"give Dense a kind of its own, then hf\.register it$"):
        hf.Model(hf.NetSpec("d", (8,), [Dense(3)], 3))
    with pytest.raises(NameClash, match=r"^layer 'dense' is already hloforge\.plugins\.layers\.dense\.Dense "):
        hf.register(Dense)


def test_a_subclass_of_a_registered_class_keeping_its_kind_is_refused_naming_this_program() -> None:
    """Before: "its kind 'channelScale' is test_register.ChannelScale's (distribution 'test_register')", a module
    named as if pip installed it."""
    hf.register(ChannelScale)

    class Sub(ChannelScale):
        pass

    with pytest.raises(PluginError, match=r"^net 's': layer 0 is .*Sub, but its kind 'channelScale' is "
                                          r"test_register\.ChannelScale's \(registered by this program: "
                                          r"hf\.register\); give Sub a kind of its own, then hf\.register it$"):
        hf.Model(hf.NetSpec("s", (8,), [Sub(), hf.layers.Dense(3)], 3))
    with pytest.raises(NameClash, match=r"^layer 'channelScale' is already test_register\.ChannelScale \(registered "
                                        r"by this program: hf\.register\); give Sub a kind of its own$"):
        hf.register(Sub)


def test_a_wrong_backward_is_refused_and_not_registered() -> None:
    with pytest.raises(PluginError, match=r"^hf\.register: layer 'wrongSoftsign' \(test_register\.WrongSoftsign\) "
                                          r"failed its gate in 1 of 1 case\(s\), first .*against jax\.vjp.*"
                                          r"not registered$"):
        hf.register(ChannelScale, WrongSoftsign)
    assert "wrongSoftsign" not in hf.layers and "channelScale" not in hf.layers  # all or none
    assert hf.register(WrongSoftsign, gate=False) is WrongSoftsign  # ungated, on the caller's word
    assert hf.layers["wrongSoftsign"] is WrongSoftsign


def test_a_class_registered_ungated_is_gated_when_registered_again_with_the_gate() -> None:
    """Before: the second call found it registered and returned, its wrong backward never gated."""
    hf.register(WrongSoftsign, gate=False)
    with pytest.raises(PluginError, match=r"^hf\.register: layer 'wrongSoftsign' .* failed its gate in 1 of 1 "):
        hf.register(WrongSoftsign)
    assert hf.layers["wrongSoftsign"] is WrongSoftsign  # as gate=False registered it: nothing of that call
    hf.register(ChannelScale, gate=False)
    hf.register(ChannelScale)
    assert default_registry().find("layer", "channelScale").gated  # type: ignore[union-attr]
    hf.register(ChannelScale, gate=False)  # registered and gated already: it stays so
    assert default_registry().find("layer", "channelScale").gated  # type: ignore[union-attr]


def test_two_classes_of_one_call_under_one_name_are_refused() -> None:
    """Before: neither was registered yet when the other's name was checked, so the second replaced the first."""
    @attrs.frozen
    class Other(WrongSoftsign):
        kind = "channelScale"

    with pytest.raises(NameClash, match=r"^layer 'channelScale' is claimed twice in this hf\.register call, by "
                                        r"test_register\.ChannelScale and by test_register\..*Other; give Other a "
                                        r"kind of its own$"):
        hf.register(ChannelScale, Other, gate=False)
    assert "channelScale" not in hf.layers  # nothing of that call
    hf.register(ChannelScale, ChannelScale)  # one class named twice is registered once
    assert hf.layers["channelScale"] is ChannelScale


def test_two_threads_registering_first_at_once_register_into_one_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each thread's first default_registry() built a registry of its own (functools.cache keeps the last),
    so one hf.register returned and its class was not registered."""
    build = Registry.__init__

    def slow(self: Registry, *args: Any, **kwargs: Any) -> None:  # both threads inside the first build at once
        build(self, *args, **kwargs)
        time.sleep(0.3)

    monkeypatch.setattr(Registry, "__init__", slow)
    threads = [threading.Thread(target=hf.register, args=(c,), kwargs={"gate": False})
               for c in (ChannelScale, HalfSquared)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert default_registry().find("layer", "channelScale") is not None
    assert default_registry().find("loss", "halfSquared") is not None


def test_two_threads_registering_two_classes_under_one_name_clash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each thread found the name free before the other had added its class: both registered, no clash."""
    import hloforge.registering

    @attrs.frozen
    class Other(WrongSoftsign):
        kind = "channelScale"

    monkeypatch.setattr(hloforge.registering, "_gate", lambda entry: time.sleep(0.3))  # both gating at once
    default_registry()
    refused: list[str] = []

    def register(cls: type) -> None:
        try:
            hf.register(cls)
        except NameClash as e:
            refused.append(str(e))

    threads = [threading.Thread(target=register, args=(c,)) for c in (ChannelScale, Other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(refused) == 1 and refused[0].startswith("layer 'channelScale' is already test_register.")


def test_an_optimizer_whose_update_is_not_optax_s_is_refused_naming_optax() -> None:
    """Before: its refusal said "against jax.vjp of its reference ... against finite differences", oracles an
    optimizer has none of: it is gated against optax, through its optax_direction."""
    from hloforge.core.variant import Optimizer

    @attrs.frozen
    class Halved(Optimizer):
        """Steps along g, while its optax oracle says g/2."""

        name: ClassVar[str] = "halved"

        def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                      scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
            return g, {}

        def optax_direction(self) -> Any:
            import optax

            return optax.scale(0.5)

    with pytest.raises(PluginError, match=r"^hf\.register: optimizer 'halved' .* failed its gate in \d+ of "
                                          r"\d+ case\(s\), first .*: error \S+ against optax \(its optax_direction\) "
                                          r"in f64 \(tolerance 1e-12\), \S+ in f32 \(1e-06\); not registered$"):
        hf.register(Halved)


def test_register_with_options_decorates_a_class() -> None:
    """Before: `@hf.register(gate=False)` was a TypeError: register() missing its component."""
    @hf.register(gate=False)
    @attrs.frozen
    class Ungated(WrongSoftsign):
        kind = "ungatedSoftsign"

    assert hf.layers["ungatedSoftsign"] is Ungated
    assert not default_registry().find("layer", "ungatedSoftsign").gated  # type: ignore[union-attr]
    with pytest.raises(PluginError, match=r"^hf\.register takes classes, got None$"):
        hf.register(None)  # a class looked up as None is no decorator asked for
    with pytest.raises(PluginError, match=r"failed its gate in 1 of 1 case"):
        @hf.register(gate=True)
        @attrs.frozen
        class Gated(WrongSoftsign):
            kind = "gatedSoftsign"


def test_an_optimizer_whose_gate_cases_are_no_instances_is_refused_in_one_line() -> None:
    """Before: an attrs NotAnAttrsClassError traceback, raised naming the failed case."""
    from hloforge.core.variant import Optimizer

    @attrs.frozen
    class Plain(Optimizer):
        name: ClassVar[str] = "plain"

        def direction(self, b: Builder, g: Value, state: Mapping[str, Value],
                      scalars: Mapping[str, Value]) -> tuple[Value, dict[str, Value]]:
            return g, {}

        @classmethod
        def gate_cases(cls) -> list[Any]:
            return [(cls(), ())]  # a layer's pair

    with pytest.raises(PluginError, match=r"^hf\.register: optimizer 'plain' \(.*Plain\) failed building its gate "
                                          r"cases: gate_cases\(\) must return optimizer instances, not \(.*Plain\("):
        hf.register(Plain)


def test_a_loss_whose_gate_cases_hold_its_class_is_refused_in_one_line() -> None:
    """Before: `(cls, shape)` for `(cls(), shape)` was an attrs NotAnAttrsClassError traceback."""
    @attrs.frozen
    class Uninstantiated(HalfSquared):
        name = "uninstantiated"

        @classmethod
        def gate_cases(cls) -> list[Any]:
            return [(cls, (4,))]

    with pytest.raises(PluginError, match=r"^hf\.register: loss 'uninstantiated' .* failed building its gate cases: "
                                          r"gate_cases\(\) must return \(loss instance, output shape\) pairs, not "
                                          r"\(<class '.*Uninstantiated'>, \(4,\)\)$"):
        hf.register(Uninstantiated)


def test_what_is_no_component_is_refused_in_one_line() -> None:
    @attrs.frozen
    class Annotated(WrongSoftsign):
        kind: str = "annotated"  # an attrs option, not the class's kind

    # before: "returned <class ...>, ...", as a plugin's hook is told of what it returned
    with pytest.raises(PluginError, match=r"^hf\.register got <class '.*Annotated'>, which is not a layer component: "
                                          r"its 'kind' is annotated, so attrs made it an option"):
        hf.register(Annotated)
    with pytest.raises(PluginError, match=r"takes classes, got ChannelScale\(\) \(hf\.register\(ChannelScale\): "):
        hf.register(ChannelScale())
    with pytest.raises(PluginError, match=r"CSVLogger is none \(a callback is given to fit as an instance"):
        hf.register(hf.CSVLogger)
    with pytest.raises(PluginError, match=r"^hf\.register takes a subclass .*; int is none; a backend or dataset"):
        hf.register(int)


def test_the_same_class_defined_again_takes_its_name_back() -> None:
    """A notebook cell run twice defines a second class of the same module and name."""
    hf.register(ChannelScale)
    again: dict[str, Any] = {}
    exec(SCALE, {**globals(), "__name__": "test_register"}, again)
    hf.register(again["ChannelScale"])
    assert hf.layers["channelScale"] is again["ChannelScale"]


def test_a_layer_of_a_class_defined_again_since_is_refused_naming_that() -> None:
    """Before: "layer 0 is test_register.ChannelScale, but its kind is test_register.ChannelScale's; give ChannelScale
    a kind of its own", advice that would not help: the net's layer was made of the cell's previous run."""
    hf.register(ChannelScale)
    net = hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3)
    again: dict[str, Any] = {}
    exec(SCALE, {**globals(), "__name__": "test_register"}, again)
    hf.register(again["ChannelScale"])
    with pytest.raises(PluginError, match=r"^net 'scaled': layer 0 is test_register\.ChannelScale of an earlier "
                                          r"definition: the class was defined again .* expected the net's layers "
                                          r"made again, of the class registered now$"):
        hf.Model(net)
    hf.Model(hf.NetSpec("scaled", (8,), [again["ChannelScale"](), hf.layers.Dense(3)], 3))


def test_a_loss_of_the_programs_own_trains_by_its_name(tmp_path: Path) -> None:
    hf.register(HalfSquared)
    x, y = digits()
    m = hf.Model(hf.NetSpec("lin", (8,), [hf.layers.Dense(3)], 3), loss="halfSquared", lr=1e-2, seed=0)
    history = m.fit(x, y, epochs=3, batch_size=32, verbose=False)
    assert history["loss"][-1] < history["loss"][0]
    m.save(str(tmp_path / "run"))
    default_registry.cache_clear()  # a program that has not registered it
    with pytest.raises(DataError, match=r"trained with loss 'halfSquared' \(class test_register\.HalfSquared\), "):
        hf.load(str(tmp_path / "run"))
    hf.register(HalfSquared)
    np.testing.assert_array_equal(hf.load(str(tmp_path / "run")).predict(x), m.predict(x))
    # the step's loss is the class's own: one step's, ½‖z − onehot(y)‖² of the initial weights computed in numpy
    net = hf.NetSpec("lin", (8,), [hf.layers.Dense(3)], 3)
    d = hf.Model(net, seed=0).predict(x[:32]) - np.eye(3)[y[:32]]
    one = hf.Model(net, loss="halfSquared", seed=0).fit(x[:32], y[:32], epochs=1, batch_size=32, verbose=False)
    assert one["loss"][0] == pytest.approx(0.5 * np.mean(np.sum(d * d, 1)), rel=1e-5)


PROGRAM = '''
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

import hloforge as hf
from hloforge.core.hlo import Builder, Value
from hloforge.core.spec import Ctx, Layer, ParamSlot, Shape
{scale}
try:
    hf.load(sys.argv[1])
except hf.HloforgeError as e:
    print("refused:", e)
hf.register(ChannelScale)
np.save(sys.argv[2], hf.load(sys.argv[1]).predict(np.load(sys.argv[3])))
'''


def test_a_saved_model_of_its_own_layer_reopens_where_the_program_registers_it(tmp_path: Path) -> None:
    """Before: `hf.load` in another program said only "unknown layer 'channelScale'" among the 48 built-in ones."""
    hf.register(ChannelScale)
    x, y = digits()
    m = hf.Model(hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3), seed=0)
    m.fit(x, y, epochs=1, batch_size=32, verbose=False)
    m.save(str(tmp_path / "run"))
    np.save(tmp_path / "x.npy", x[:7])
    (tmp_path / "program.py").write_text(PROGRAM.format(scale=SCALE))
    done = subprocess.run([sys.executable, str(tmp_path / "program.py"), str(tmp_path / "run"),
                           str(tmp_path / "p.npy"), str(tmp_path / "x.npy")],
                          env=env_with(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    file = tmp_path / "run" / "checkpoint.safetensors"
    assert done.stdout.strip() == (
        f"refused: checkpoint {file}: it was trained with layer 'channelScale' (class test_register.ChannelScale), "
        "which the program that trained it registered itself (hf.register), and which is not registered here; "
        "expected that class registered again first (hf.register in your program; for a hloforge command, packaged "
        "as a plugin: docs/plugins.md)")
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), m.predict(x[:7]))
    cli = subprocess.run([sys.executable, "-m", "hloforge", "eval", str(tmp_path / "run")], env=env_with(),
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode != 0 and "Traceback" not in cli.stderr
    assert cli.stderr.strip().endswith("packaged as a plugin: docs/plugins.md)")


def test_a_saved_model_refuses_a_missing_class_in_this_program_too(tmp_path: Path) -> None:
    hf.register(ChannelScale)
    m = hf.Model(hf.NetSpec("scaled", (8,), [ChannelScale(), hf.layers.Dense(3)], 3), seed=0)
    m.save(str(tmp_path / "run"))
    default_registry.cache_clear()  # a program that has not registered it
    with pytest.raises(DataError, match=r"trained with layer 'channelScale' \(class test_register\.ChannelScale\)"):
        hf.load(str(tmp_path / "run"))


def test_gate_cases_of_another_class_do_not_gate_this_one() -> None:
    """`gate_cases` returning another class's instances (a copy-paste from a sibling layer) gated that class, and
    registered this one ungated."""
    @attrs.frozen
    class Borrowed(Layer):
        kind = "borrowed"

        def out_shape(self, in_shape: Shape) -> Shape:
            return in_shape

        def forward(self, b: Builder, x: Value, params: Mapping[str, Value], ctx: Ctx) -> Value:
            return x * 3.0  # wrong: the reference doubles

        def reference(self, params: Mapping[str, Any], x: Any, ctx: Ctx | None) -> Any:
            return x * 2.0

        @classmethod
        def gate_cases(cls) -> list[tuple[Layer, Shape]]:
            return [(ChannelScale(), (3,))]

    with pytest.raises(PluginError, match=r"^hf\.register: layer 'borrowed' \(.*Borrowed\): its gate cases hold no "
                                          r"Borrowed \(they hold \['ChannelScale'\]\), so its own code is not "
                                          r"verified; expected cases of Borrowed instances$"):
        hf.register(Borrowed)
    assert "borrowed" not in hf.layers
