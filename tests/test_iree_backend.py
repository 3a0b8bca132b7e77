"""The IREE backend: compile cache, errors, donation, and the same train step as on XLA."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from hloforge.core.errors import BackendError
from hloforge.core.modules import train_step_module
from hloforge.core.registry import default_registry
from hloforge.core.variant import Variant
from hloforge.train.session import make_backend
from hloforge.zoo import get_net

pytest.importorskip("iree.compiler")
pytest.importorskip("iree.runtime")

from hloforge.backends.iree import IreeBackend, cache_key  # noqa: E402
from hloforge.backends.iree.backend import IreeCacheWarning  # noqa: E402
from hloforge.testing.backend_conformance import STEP, G, W  # the train-step pattern every backend runs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path))
    return tmp_path / "iree"


@pytest.fixture
def iree(cache):
    return IreeBackend()


def rel(a, b) -> float:
    a = np.concatenate([np.asarray(p, np.float64).ravel() for p in a])
    b = np.concatenate([np.asarray(p, np.float64).ravel() for p in b])
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_interface_and_name(iree):  # the Backend protocol itself: tests/test_backend_conformance.py
    assert iree.backend_name().startswith("iree (llvm-cpu, compiler ")
    assert "--iree-llvmcpu-target-cpu=host" in iree.flags


def test_selected_by_name_and_env(cache, monkeypatch):
    assert type(make_backend("iree")).__name__ == "IreeBackend"
    monkeypatch.setenv("HLOFORGE_BACKEND", "iree")
    assert make_backend().name == "iree"
    monkeypatch.delenv("HLOFORGE_BACKEND")
    assert make_backend().name == "xla"


def test_an_unknown_target_in_the_variable_is_refused_naming_it(cache, monkeypatch):
    """HLOFORGE_IREE_TARGET=vulkan read 'iree target 'vulkan' is not supported', naming no variable, and `eval RUN`
    put it on the checkpoint ('checkpoint RUN/checkpoint.safetensors: iree target ...'). Now a SettingError,
    which names the variable and which no caller prefixes with its file; the argument's refusal is as it was."""
    from hloforge.core.errors import SettingError

    monkeypatch.setenv("HLOFORGE_IREE_TARGET", "vulkan")
    with pytest.raises(SettingError, match=r"^HLOFORGE_IREE_TARGET='vulkan': not an iree target; expected one of "
                                           r"\['cuda', 'llvm-cpu', 'rocm'\], or the variable unset \(llvm-cpu\)$"):
        IreeBackend()
    with pytest.raises(BackendError, match=r"^iree target 'metal' is not supported") as refused:
        IreeBackend(target="metal")
    assert not isinstance(refused.value, SettingError)


@pytest.mark.parametrize("target, arch", [("cuda", "sm80"), ("cuda", "sm_999"), ("rocm", "mi300")])
def test_a_gpu_architecture_iree_does_not_know_is_refused_in_one_line(cache, monkeypatch, target, arch):
    """HLOFORGE_IREE_GPU_ARCH=sm80 surfaced as iree-compile's ~20 lines ('Unknown CUDA target', a stack dump, the
    module's head). Now one line naming the variable and the form expected; iree-compile builds a GPU target's
    module without a GPU, so this runs anywhere. The argument's refusal names the argument, and is no SettingError."""
    from hloforge.core.errors import SettingError

    monkeypatch.setenv("HLOFORGE_IREE_TARGET", target)
    monkeypatch.setenv("HLOFORGE_IREE_GPU_ARCH", arch)
    form = {"cuda": r"an NVIDIA compute capability as sm_<major><minor> \(sm_80", "rocm": r"an AMD ISA as gfx<id>"}
    with pytest.raises(SettingError, match=rf"^HLOFORGE_IREE_GPU_ARCH='{arch}': iree-compile knows no {target} "
                                           rf"architecture of that name; expected {form[target]}[^\n]*, or the "
                                           rf"variable unset \((sm_80|gfx942)\)$"):
        IreeBackend().compile_artifact(STEP)
    monkeypatch.delenv("HLOFORGE_IREE_GPU_ARCH")
    with pytest.raises(BackendError, match=rf"^gpu_arch='{arch}': iree-compile knows no {target} architecture") as e:
        IreeBackend(gpu_arch=arch).compile_artifact(STEP)
    assert not isinstance(e.value, SettingError) and "\n" not in str(e.value)


def test_missing_package_names_pip_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "iree.compiler", None)  # import now raises ImportError
    with pytest.raises(BackendError, match="pip install iree-base-compiler iree-base-runtime"):
        make_backend("iree")


def test_step_runs_and_donation(iree):
    exe = iree.compile(STEP)
    assert exe.donated_inputs == (0,)
    w, g = iree.to_device(W), iree.to_device(G)
    new_w, total = iree.execute(exe, [w, g])
    np.testing.assert_allclose(iree.to_host(new_w), W - 0.1)
    # sum(w), not sum(w'): with the donation tie IREE 3.13 reads w after w' overwrote it (14.4)
    assert float(iree.to_host(total)) == 15.0
    assert w.is_deleted and not g.is_deleted  # donated: consumed, as on XLA
    with pytest.raises(BackendError, match="donated .* argument 0"):
        iree.execute(exe, [w, g])
    # keep=[0]: the input survives, untouched, and the result is the same
    w2 = iree.to_device(W)
    out, _ = iree.execute(exe, [w2, g], keep=[0])
    np.testing.assert_array_equal(iree.to_host(w2), W)
    np.testing.assert_allclose(iree.to_host(out), W - 0.1)


def test_an_input_slot_is_rewritten_in_place(iree):
    exe = iree.compile(STEP)
    g = iree.input_slot((2, 3), np.dtype(np.float32))
    for scale in (1.0, 2.0, -3.0):  # each write is what the next execute reads: never a stale copy
        new_w, _ = iree.execute(exe, [iree.to_device(W), g.write(G * np.float32(scale))])
        np.testing.assert_allclose(iree.to_host(new_w), W - 0.1 * scale, rtol=1e-6)
        assert not g.buffer.is_deleted
    with pytest.raises(BackendError, match=r"holds a float32 array of shape \[2, 3\]; got float32 \[3\]"):
        g.write(np.zeros(3, np.float32))
    w = iree.input_slot((2, 3), np.dtype(np.float32))  # as a donated input it is consumed; the next write says so
    iree.execute(exe, [w.write(W), iree.to_device(G)])
    with pytest.raises(BackendError, match="donated .* argument 0"):
        w.write(W)


def test_aliasing_stripped_for_iree_only():
    from hloforge.backends.iree.backend import strip_aliasing

    text = "%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<f32> {x = 1, tf.aliasing_output = 3 : i32}"
    assert strip_aliasing(text) == "%a: tensor<2xf32>, %b: tensor<f32> {x = 1}"


def test_the_iree_backend_loads_no_pjrt_module():
    """The signature parsing it shares with XLA is backend-neutral: importing it loads no PJRT cffi
    declarations (a fresh process: this one has loaded the XLA backend already)."""
    script = "import sys, hloforge.backends.iree.backend; print([m for m in sys.modules if 'pjrt' in m])"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_wrong_dtype_or_shape_refused_before_execution(iree):
    exe = iree.compile(STEP)
    w = iree.to_device(W)
    with pytest.raises(BackendError, match=r"argument 1 is IreeBuffer\(2x3 float64\).*2x3 float32"):
        iree.execute(exe, [w, iree.to_device(G.astype(np.float64))])
    with pytest.raises(BackendError, match=r"argument 1 is IreeBuffer\(3x2 float32\)"):
        iree.execute(exe, [w, iree.to_device(G.reshape(3, 2))])
    with pytest.raises(BackendError, match="takes 2 arguments, got 1"):
        iree.execute(exe, [w])
    assert not w.is_deleted  # refused before anything ran or was donated
    np.testing.assert_array_equal(iree.to_host(w), W)


def test_rejected_module_is_one_clear_error(iree, cache):
    bad = STEP.replace("stablehlo.subtract %w, %1", "stablehlo.subtract %w, %g2")
    with pytest.raises(BackendError) as info:
        iree.compile(bad)
    msg = str(info.value)
    assert "iree-compile (llvm-cpu" in msg and "rejected the module" in msg
    assert "%g2" in msg  # the compiler's own diagnostic
    assert str(cache) in msg  # the artifact path
    assert "module begins:\nmodule @step {" in msg
    assert not list(cache.glob("*.vmfb")) and not list(cache.glob("*.tmp"))


def test_cannot_do_is_loud(iree):
    with pytest.raises(BackendError, match="one device only"):
        iree.compile(STEP, num_replicas=2)
    with pytest.raises(BackendError, match="cross-replica"):
        iree.compile(STEP.replace("module @step {", "module @step attributes {mhlo.num_replicas = 2 : i32} {"))
    xla = make_backend("xla")
    with pytest.raises(BackendError, match="num_replicas=64"):
        xla.compile(STEP, num_replicas=64)


def test_cache_hit_does_not_recompile_and_changes_miss(cache, monkeypatch):
    be = IreeBackend()
    exe = be.compile(STEP)
    assert not exe.cache_hit and be.stats["compiles"] == 1
    files = list(cache.glob("*.vmfb"))
    assert files == [exe.artifact]
    before = exe.artifact.stat()

    # a second backend (as a second run would) hits: no compiler invocation at all
    be2 = IreeBackend()
    with monkeypatch.context() as m:
        m.setattr(be2.compiler, "compile_str", lambda *a, **k: pytest.fail("recompiled on a cache hit"))
        exe2 = be2.compile(STEP)
    assert exe2.cache_hit and be2.stats == {"compiles": 0, "hits": 1, "compile_s": 0.0}
    after = exe2.artifact.stat()
    assert after.st_ino == before.st_ino  # not rewritten (a write renames a new file into place) ...
    assert after.st_mtime_ns >= before.st_mtime_ns  # ... but touched: pruning keeps the recently used
    out, _ = be2.execute(exe2, [be2.to_device(W), be2.to_device(G)])
    np.testing.assert_allclose(be2.to_host(out), W - 0.1)

    # a change in the text misses
    exe3 = be.compile(STEP.replace("1.000000e-01", "2.000000e-01"))
    assert not exe3.cache_hit and be.stats["compiles"] == 2 and exe3.artifact != exe.artifact
    # ... and so does a change of flags or target (the target cross-compiles without its device)
    be4 = IreeBackend(extra_flags=["--iree-llvmcpu-enable-ukernels=none"])
    assert not be4.compile(STEP).cache_hit and be4.stats["compiles"] == 1
    k = cache_key(STEP, "llvm-cpu", be.flags, be.version)
    assert k != cache_key(STEP, "cuda", be.flags, be.version) != cache_key(STEP, "llvm-cpu", be.flags, "other")
    cuda = IreeBackend(target="cuda")
    path, hit = cuda.compile_artifact(STEP)
    assert not hit and path.parent == cache and path != exe.artifact and path.stat().st_size > 0
    assert cuda.compile_artifact(STEP) == (path, True)
    assert not list(cache.glob("*.tmp"))


def test_an_artifact_built_ahead_onto_a_full_disk_says_so(cache, monkeypatch):
    """compile_artifact (a GPU module built ahead on a CPU machine) whose cache disk is full said 'cache directory
    ... is not writable', sending the user to permissions; now the cause itself, after the cache's one warning.
    The compile's run goes on from memory, as before (compile's own path); no entry, no temp file is left."""
    from hloforge.backends import disk_cache

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk_cache.os, "fsync", full)
    monkeypatch.setattr(disk_cache, "_UNWRITABLE", set())
    with pytest.warns(IreeCacheWarning, match="No space left on device"), \
            pytest.raises(BackendError, match=r"^could not write the artifact .*\.vmfb: No space left on device; "
                                              r"expected a cache directory this user can write, with room for it "):
        IreeBackend(target="cuda").compile_artifact(STEP)
    assert not list(cache.iterdir())


def test_a_write_prunes_the_cache_to_its_size_but_keeps_the_new_artifact(cache, monkeypatch):
    be = IreeBackend()
    old = be.compile(STEP).artifact
    monkeypatch.setenv("HLOFORGE_CACHE_MAX_MB", "0")  # keeps only what was just written
    exe = be.compile(STEP.replace("1.000000e-01", "2.000000e-01"))
    assert list(cache.glob("*.vmfb")) == [exe.artifact] and not old.exists()
    out, _ = be.execute(exe, [be.to_device(W), be.to_device(G)])
    np.testing.assert_allclose(be.to_host(out), W - 0.2, rtol=1e-6)


def test_an_entry_swapped_with_another_keys_is_compiled_again_not_run(cache):
    """Two cache entries swapped (or one copied over another): the train step's key held the eval
    forward's artifact and the run stopped with 'expected 10 arguments but passed 24', every run after
    it too; two modules of one signature ran the other one's program (W - 0.2 for W - 0.1: a plausible
    wrong number). Now each artifact carries its key, and one that is not its path's is compiled again
    with one warning, and replaced."""
    be = IreeBackend()
    one, two = be.compile(STEP).artifact, be.compile(STEP.replace("1.000000e-01", "2.000000e-01")).artifact
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)
    be2 = IreeBackend()
    with pytest.warns(IreeCacheWarning, match=r"IREE cache entry .* is another key's entry .*; compiling again "
                                              r"and replacing it"):
        exe = be2.compile(STEP)
    out, _ = be2.execute(exe, [be2.to_device(W), be2.to_device(G)])
    np.testing.assert_allclose(be2.to_host(out), W - 0.1, rtol=1e-6)
    assert be2.stats["compiles"] == 1 and one.read_bytes() != b  # replaced by its own
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert IreeBackend().compile(STEP).cache_hit  # ... which the next run takes without a word


def test_an_entry_of_a_read_only_cache_is_a_hit_not_compiled_again(cache, monkeypatch):
    """IREE's VmModule.mmap opens the file for writing, so on a read-only mount (EROFS) or another user's
    cache (EACCES) every whole entry was taken for damaged: 'does not load ... compiling again and replacing
    it' per module, a compile each run, and a second warning that the cache cannot be written. Now such an
    entry is read into memory and used, without a word."""
    path = IreeBackend().compile(STEP).artifact
    be = IreeBackend()

    def read_only_mmap(instance, filepath, *args, **kwargs):  # what IREE raises on a read-only mount
        raise OSError(errno.EROFS, "Read-only file system", filepath)

    monkeypatch.setattr(be.runtime.VmModule, "mmap", read_only_mmap)
    monkeypatch.setattr(be.compiler, "compile_str", lambda *a, **k: pytest.fail("recompiled a whole entry"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exe = be.compile(STEP)
    assert exe.cache_hit and exe.artifact == path
    out, _ = be.execute(exe, [be.to_device(W), be.to_device(G)])
    np.testing.assert_allclose(be.to_host(out), W - 0.1, rtol=1e-6)


def test_two_processes_share_the_cache(cache):
    """Both compile the same module into one cache at once; atomic renames leave one whole artifact."""
    script = textwrap.dedent(f"""
        import numpy as np
        from hloforge.backends.iree import IreeBackend
        be = IreeBackend()
        exe = be.compile({STEP!r})
        w, g = be.to_device(np.zeros((2, 3), np.float32)), be.to_device(np.ones((2, 3), np.float32))
        out, _ = be.execute(exe, [w, g])
        assert abs(float(be.to_host(out).sum()) + 0.6) < 1e-5
    """)
    env = {**os.environ, "HLOFORGE_CACHE_DIR": str(cache.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read().decode()
    assert len(list(cache.glob("*.vmfb"))) == 1 and not list(cache.glob("*.tmp"))
    assert IreeBackend().compile(STEP).cache_hit


def test_an_artifact_with_another_abi_is_refused_in_one_line(cache):
    """execute passes @main a wait and a signal fence (EXECUTION_FLAGS); a module compiled to IREE's
    synchronous ABI (a later flag wins) would take them as arguments it does not have."""
    be = IreeBackend(cache_dir=cache, extra_flags=["--iree-execution-model=async-internal"])
    with pytest.raises(BackendError, match=r"has the synchronous ABI; execute expects coarse-fences \(compile "
                                           r"with --iree-execution-model=async-external\)"):
        be.compile(STEP)


def test_runtime_flags_are_set_once_and_a_bad_one_is_one_clear_error(monkeypatch):
    """In child processes (IREE's runtime flags are process-wide, read before the first device)."""
    from hloforge.backends.iree import runtime as iree_runtime

    script = textwrap.dedent(f"""
        import numpy as np
        from hloforge.backends.iree import IreeBackend
        be = IreeBackend()
        print(be.fingerprint())
        out, _ = be.execute(be.compile({STEP!r}), [be.to_device(np.zeros((2, 3), np.float32)),
                                                  be.to_device(np.ones((2, 3), np.float32))])
        import os, pathlib
        workers = [int(t.name) for t in pathlib.Path("/proc/self/task").iterdir()
                   if (t / "comm").read_text().startswith("iree-worker")]
        print("workers", len(workers), "nicer by", sorted({{os.getpriority(os.PRIO_PROCESS, w) - os.getpriority(
            os.PRIO_PROCESS, 0) for w in workers}}))
    """)
    env = {k: v for k, v in os.environ.items()
           if k not in (iree_runtime.RUNTIME_FLAGS_ENV_VAR, iree_runtime.WORKER_NICE_ENV_VAR)}
    default = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    fingerprint, workers = default.stdout.strip().splitlines()
    assert default.returncode == 0 and "runtime --task_worker_spin_us=50 worker nice 1 host memory " in fingerprint
    # the task-system workers run one step nicer than the caller (see DEFAULT_WORKER_NICE); 0 leaves them
    assert workers.startswith("workers ") and workers.endswith("nicer by [1]") and workers != "workers 0 nicer by []"
    left = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**env, iree_runtime.WORKER_NICE_ENV_VAR: "0"})
    assert left.returncode == 0 and left.stdout.strip().endswith("nicer by [0]")
    bad_nice = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              env={**env, iree_runtime.WORKER_NICE_ENV_VAR: "-5"})
    assert bad_nice.returncode != 0
    said = "BackendSettingError: HLOFORGE_IREE_WORKER_NICE='-5': expected a niceness step from 0 to 19"
    assert said in bad_nice.stderr
    bad = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**env, iree_runtime.RUNTIME_FLAGS_ENV_VAR: "--no_such_flag=1"})
    assert bad.returncode != 0
    assert ("BackendSettingError: IREE refused the runtime flags --no_such_flag=1 ($HLOFORGE_IREE_RUNTIME_FLAGS): "
            in bad.stderr and "'no_such_flag' not recognized" in bad.stderr)
    monkeypatch.setenv(iree_runtime.RUNTIME_FLAGS_ENV_VAR, "")
    assert iree_runtime.runtime_flags() == ()  # empty: IREE's own defaults


def one_step(backend, spec, batch, seed=5):
    """One train step from a given init and batch: the raw module, no session."""
    text, lay = train_step_module(spec, Variant("adam"), batch)
    exe = backend.compile(text)
    rng = np.random.default_rng(seed)
    init = spec.init_params(seed)
    opt = Variant("adam").make_optimizer(default_registry())
    state = [opt.init_state(s)[k] for k in lay.state for _, s in lay.params]
    x = rng.standard_normal(lay.x_shape).astype(np.float32)
    y = rng.integers(0, spec.num_classes, lay.y_shape).astype(np.int32)
    host = [*init, *state, Variant("adam").state_layout(opt).host_schedule(opt, 1, 1e-3), x, y]
    outs = backend.execute(exe, [backend.to_device(np.asarray(a)) for a in host])
    return [backend.to_host(o) for o in outs[:lay.n_params]], init, float(backend.to_host(outs[lay.loss_index]))


@pytest.mark.parametrize(("net", "batch", "tol"), [("mnist-mlp", 16, 1e-5), ("mnist-cnn", 4, 1e-4)])
def test_same_train_step_on_xla_and_iree(iree, net, batch, tol):
    spec = get_net(net)
    got, init, loss_i = one_step(iree, spec, batch)
    want, _, loss_x = one_step(make_backend("xla"), spec, batch)
    assert rel(got, init) > 1e-4  # the step moved θ
    assert rel(got, want) < tol
    assert abs(loss_i - loss_x) < 1e-5 * abs(loss_x)


# ------------------------------------------------------------------ transient storage
def test_main_keeps_its_transients_in_a_storage_parameter_and_each_result_goes_through_it():
    from hloforge.backends.iree.transients import with_transient_storage

    # a result attribute with a brace in a string, function attributes, a region in the body
    signature = ('  func.func public @main(%w: tensor<2x3xf32>, %g: tensor<2x3xf32>) -> (tensor<2x3xf32> '
                 '{a = "x}"}, tensor<f32>) attributes {b = {c}} {\n')
    text = ("module {\n" + signature + "    %0 = stablehlo.subtract %w, %g : tensor<2x3xf32>\n"
            '    %1 = "stablehlo.reduce"(%0, %z) ({\n    ^bb0(%p: tensor<f32>, %q: tensor<f32>):\n'
            '      "stablehlo.return"(%p) : (tensor<f32>) -> ()\n'
            '    }) : (tensor<2x3xf32>, tensor<f32>) -> tensor<f32>\n'
            "    return %0, %1 : tensor<2x3xf32>, tensor<f32>\n  }\n}\n")
    got = with_transient_storage(text)
    assert got is not None
    assert ", %hloforge_transients: !hal.buffer {iree.abi.transients}) -> (tensor<2x3xf32> {a = \"x}\"}" in got
    assert "%hloforge_transient1 = hal.tensor.transients %1 : tensor<f32> from %hloforge_transients : !hal.buffer" \
        in got
    assert "    return %hloforge_transient0, %hloforge_transient1 : tensor<2x3xf32>, tensor<f32>\n  }\n}\n" in got
    one = with_transient_storage("func.func @main() -> tensor<f32> {\n  %c = stablehlo.constant dense<1.0> : "
                                 "tensor<f32>\n  func.return %c : tensor<f32>\n}\n")
    assert one is not None and "@main(%hloforge_transients: !hal.buffer {iree.abi.transients})" in one
    # a text whose @main it cannot read is compiled as it is
    assert with_transient_storage("func.func @step(%a: tensor<f32>) -> tensor<f32> {\n  return %a : tensor<f32>\n}") \
        is None
    assert with_transient_storage("func.func @main(%a: tensor<f32>) -> tensor<f32> {\n  %b = stablehlo.abs %a : "
                                  "tensor<f32>\n}") is None


# resnet-mini's train step at batch 128 on IREE, ten steps in a fresh process: with its transients in the
# executable's own storage, the process does not grow from step to step. (With IREE 3.13 allocating them
# from its device pool the same run grew 81 MB between steps 3 and 10, and resnet18-cifar's ~200 MB a step.)
_STEPS_IN_PLACE = r'''
import re
import numpy as np
from hloforge.core.variant import Variant
from hloforge.train.session import TrainSession, make_backend
from hloforge.zoo import get_net
spec = get_net("resnet-mini")
s = TrainSession(spec, Variant("adam"), 128, make_backend("iree"), seed=0)
rng = np.random.default_rng(0)
x = rng.standard_normal((128, *spec.input_shape)).astype(np.float32)
y = rng.integers(0, spec.num_classes, 128).astype(np.int32)
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) >> 10
seen = []
for i in range(10):
    s.train_step(x, y, 1e-3)
    seen.append(rss())
print(s.exe.transient_storage is not None, seen[2], seen[-1])
'''


def test_an_iree_train_step_reuses_its_transient_memory_call_after_call(cache):
    done = subprocess.run([sys.executable, "-c", _STEPS_IN_PLACE], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HLOFORGE_CACHE_DIR": str(cache.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    stored, third, last = done.stdout.split()[-3:]
    assert stored == "True"
    assert int(last) - int(third) < 16, f"the process grew from {third} MB at step 3 to {last} MB at step 10"


def test_a_models_forwards_run_from_several_threads_at_once(cache):
    """Two of one model's forwards executed from two threads at once (a server's predicts of varying batch size,
    or a predict beside a fit's step) made the same timeline fences: a predict hung for good, or a fit's step
    failed with 'semaphore already signaled past'."""
    import threading

    import hloforge as hf

    x = np.random.default_rng(0).standard_normal((100, 784)).astype(np.float32)
    m = hf.Model("mnist-linear", backend="iree")
    want = {b: m.predict(x, batch_size=b) for b in (8, 16, 32, 64)}
    wrong: list[object] = []

    def score(b: int) -> None:
        try:
            wrong.extend(b for _ in range(20) if not np.array_equal(m.predict(x, batch_size=b), want[b]))
        except Exception as e:  # noqa: BLE001 - told as the failure
            wrong.append(e)

    threads = [threading.Thread(target=score, args=(b,), daemon=True) for b in (8, 16, 32, 64) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and wrong == []
