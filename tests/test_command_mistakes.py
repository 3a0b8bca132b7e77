"""A user's mistake on the command line is one line naming it and what was expected (exit 3), never XLA's
fatal log and usage dump, a misdiagnosis, a file blamed for an environment variable, or a raw errno:
a malformed XLA_FLAGS, an environment variable's bad value, a file that is no state dict, and a file
where a directory is expected."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys

import pytest
from test_image_commands_input import refused  # tests/ is on sys.path (rootdir-relative, no package)

from hloforge.backends.xla import find_plugin
from hloforge.backends.xla.pjrt.xla_flags import check_xla_flags
from hloforge.cli import main
from hloforge.core.errors import BackendError
from hloforge.train.trainer import TrainConfig, train


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory) -> str:
    """A one-epoch mnist-mlp run (about a second)."""
    out = str(tmp_path_factory.mktemp("mistakes") / "r1")
    train(TrainConfig(net="mnist-mlp", epochs=1, batch=64, run_dir=out), progress=False, log=quiet)
    return out


def hloforge(argv: list[str], env: dict[str, str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """`hloforge ARGV` in a fresh process (what a variable read once per process needs), under `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("HLOFORGE_DEBUG", "XLA_FLAGS")}
    return subprocess.run([sys.executable, "-m", "hloforge.cli", *argv], env=base | env, capture_output=True,
                          text=True, timeout=300, cwd=cwd)


# ------------------------------------------------------------------ 1. XLA_FLAGS XLA would stop at
@pytest.mark.parametrize("flags,needle", [
    ("xla_cpu_enable_fast_math=true", "XLA_FLAGS='xla_cpu_enable_fast_math=true' does not start with '--', so "
                                      "XLA would read it as a flag file's path, and no such file exists; "
                                      "expected --NAME or --NAME=VALUE"),
    ("--xla_cpu_enable_fast_math=maybe", "XLA_FLAGS: --xla_cpu_enable_fast_math=maybe is not a value XLA's boolean "
                                         "flags take (XLA would stop at it); expected --xla_cpu_enable_fast_math, "
                                         "or --xla_cpu_enable_fast_math=true/false/1/0"),
    ("--xla_cpu_enable_fast_math=yes", "--xla_cpu_enable_fast_math=yes is not a value XLA's boolean flags take"),
    ("--xla_cpu_enable_fast_math=", "--xla_cpu_enable_fast_math= is not a value XLA's boolean flags take"),
    ("--xla_dump_to", "XLA_FLAGS: --xla_dump_to needs a value (XLA would stop at it); expected --xla_dump_to=VALUE"),
    ("--xla_force_host_platform_device_count=two", "--xla_force_host_platform_device_count=two is not an integer"),
    ("--xla_force_host_platform_device_count=99999999999", "is not an integer XLA takes"),  # past int32
    ("--xla_cpu_enable_fast_math=true xla_dump_to=/tmp/d", "XLA_FLAGS: 'xla_dump_to=/tmp/d' is not a flag (XLA would "
                                                           "ignore it); expected --NAME or --NAME=VALUE"),
    ("--xla_cpu_enable_fast_math -xla_dump_to=/tmp/d", "'-xla_dump_to=/tmp/d' is not a flag (XLA would stop at it)"),
])
def test_a_malformed_xla_flags_is_one_line_before_xla_loads(flags, needle, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", flags)
    with pytest.raises(BackendError) as said:
        check_xla_flags(find_plugin())
    assert needle in str(said.value) and "\n" not in str(said.value)


def test_a_name_in_the_plugin_that_xla_registers_no_flag_for_is_one_line(monkeypatch):
    """Before: xla_cpu_use_multi_output_fusion (a string in the plugin's file, but no DebugOptions field and no
    flag of this XLA) passed the name check, and XLA ended the process as its client started: a fatal log line,
    exit 1, a user's notebook kernel gone. Now XLA's own parsing is asked in a child process: one line."""
    plugin = find_plugin()
    for flags, named in [("--xla_cpu_enable_fast_math=false --xla_cpu_use_multi_output_fusion=true",
                          "xla_cpu_use_multi_output_fusion"),
                         ("--noxla_cpu_use_multi_output_fusion", "noxla_cpu_use_multi_output_fusion")]:
        monkeypatch.setenv("XLA_FLAGS", flags)
        with pytest.raises(BackendError) as said:
            check_xla_flags(plugin)
        assert str(said.value).startswith(f"XLA_FLAGS: --{named} is not a flag of the XLA plugin {plugin} ")
        assert "\n" not in str(said.value)


@pytest.mark.parametrize("flags, said", [
    ("--xla_cpu_scheduler_type=bogus", "--xla_cpu_scheduler_type=bogus is not a value XLA's flag parsing takes"),
    ("--xla_cpu_enable_fast_math=false --xla_gpu_autotune_gemm_rtol=abc",
     "--xla_gpu_autotune_gemm_rtol=abc is not a value XLA's flag parsing takes"),
    ("--xla_cpu_use_thunk_runtime=maybe", "--xla_cpu_use_thunk_runtime=maybe is not a value XLA's flag parsing"),
    (" ", "XLA_FLAGS=' ' does not start with '--', so XLA would read it as a flag file's path"),
])
def test_a_value_xla_cannot_parse_is_one_line(flags, said, monkeypatch) -> None:
    """Before: an enum's or a float's bad value, a retired flag's, and a blank value passed the check, and XLA
    ended the process (a fatal line and a usage dump of every flag, exit 1). The file cannot say an enum's
    value names, so XLA's own parsing is asked, one flag at a time once it refuses them together."""
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.delenv("HLOFORGE_XLA_FLAGS_TAKEN", raising=False)
    with pytest.raises(BackendError) as error:
        check_xla_flags(find_plugin())
    assert said in str(error.value) and "\n" not in str(error.value)


def test_flags_xla_took_are_not_asked_again_by_a_child(monkeypatch) -> None:
    """An enum flag XLA takes is asked of XLA once; the mark this process leaves spares its compile worker."""
    from hloforge.backends.xla.pjrt import xla_flags

    flags = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.delenv("HLOFORGE_XLA_FLAGS_TAKEN", raising=False)
    asked = []
    real = xla_flags._xla_stops_at
    monkeypatch.setattr(xla_flags, "_xla_stops_at", lambda *a: asked.append(a) or real(*a))
    check_xla_flags(find_plugin())
    check_xla_flags(find_plugin())
    assert len(asked) == 1 and os.environ["HLOFORGE_XLA_FLAGS_TAKEN"] == flags


def test_every_spelling_xla_takes_passes(monkeypatch, tmp_path):
    """Each of these XLA parses (checked against the plugin when written): booleans in any case and as 1/0 or
    bare, an empty string value, a quoted one with a space, a flag that is no DebugOptions field, a name
    not XLA's (left to XLA), and a flag file (a value not starting with '-' that names one)."""
    plugin = find_plugin()
    for flags in ["", "  --xla_cpu_enable_fast_math", "--xla_cpu_enable_fast_math=True",
                  "--xla_cpu_enable_fast_math=0", "--xla_dump_to=", f"--xla_dump_to='{tmp_path}/a b' --v=1",
                  "--xla_force_host_platform_device_count=+2", "--xla_cpu_use_thunk_runtime=true",
                  "--xla_backend_extra_options=xla_cpu_disable_loop_unrolling",
                  "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"]:
        monkeypatch.setenv("XLA_FLAGS", flags)
        check_xla_flags(plugin)
    good, bad = tmp_path / "good-flags", tmp_path / "bad-flags"
    good.write_text("--xla_cpu_enable_fast_math=false\n--xla_dump_to='/tmp/a b'\n")
    bad.write_text("--xla_cpu_enable_fast_math=maybe\n")
    monkeypatch.setenv("XLA_FLAGS", str(good))
    check_xla_flags(plugin)
    monkeypatch.setenv("XLA_FLAGS", str(bad))  # a flag file's flags are checked as the variable's are
    with pytest.raises(BackendError, match=rf"^XLA_FLAGS \(flag file {bad}\): --xla_cpu_enable_fast_math=maybe is"):
        check_xla_flags(plugin)


def test_hloforge_eval_says_the_xla_flags_mistake_alone(mlp_run):
    """Before: XLA's F0000 line and a usage dump of every flag, exit 1 (verify's code); then the check
    named the checkpoint as if the run were at fault. Now one line, exit 3, naming XLA_FLAGS first."""
    for flags in ("xla_cpu_enable_fast_math=true", "--xla_cpu_enable_fast_math=maybe", "--xla_dump_to"):
        proc = hloforge(["eval", mlp_run], {"XLA_FLAGS": flags})
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert proc.stderr.startswith("hloforge: error: XLA_FLAGS") and len(proc.stderr.splitlines()) == 1, \
            proc.stderr[-2000:]


# ------------------------------------------------------------------ 5. an environment variable blamed on a file
@pytest.mark.parametrize("var,value,said", [
    ("HLOFORGE_CACHE_MAX_MB", "abc", "HLOFORGE_CACHE_MAX_MB='abc': expected a whole number of MiB"),
    ("HLOFORGE_HOST_MEMORY", "abc", "HLOFORGE_HOST_MEMORY='abc': expected one of retain, release"),
    ("HLOFORGE_PJRT_PLUGIN", "/no/such/plugin.so", "HLOFORGE_PJRT_PLUGIN=/no/such/plugin.so: no such plugin file"),
    ("XLA_FLAGS", "--xla_cpu_enable_fast_mth=1", "XLA_FLAGS: --xla_cpu_enable_fast_mth is not a flag of"),
    ("HLOFORGE_XLA_CACHE", "maybe", "HLOFORGE_XLA_CACHE='maybe': expected 1/true/yes/on"),
])
def test_an_environment_variable_error_is_its_own_not_the_checkpoints(var, value, said, mlp_run):
    proc = hloforge(["eval", mlp_run], {var: value})
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"hloforge: error: {said}"), proc.stderr  # no "checkpoint …: " before it
    assert len(proc.stderr.splitlines()) == 1


def test_an_iree_variable_is_not_taken_for_a_damaged_cache_entry(mlp_run, tmp_path):
    """With the eval artifact cached, a bad HLOFORGE_IREE_WORKER_NICE failed the entry's load and was
    said as 'IREE cache entry … does not load …; compiling again and replacing it' before the real error."""
    pytest.importorskip("iree.runtime")
    env = {"HLOFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = hloforge(["eval", mlp_run, "--backend", "iree"], env)
    assert first.returncode == 0, first.stderr[-2000:]
    proc = hloforge(["eval", mlp_run, "--backend", "iree"], env | {"HLOFORGE_IREE_WORKER_NICE": "abc"})
    assert proc.returncode == 3 and "cache entry" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("hloforge: error: HLOFORGE_IREE_WORKER_NICE='abc': expected a niceness step "
                                   "from 0 to 19")


# ------------------------------------------------------------------ 4. import-weights on what is no state dict
@pytest.mark.parametrize("text", ["garbage\n", "junk\n"])  # "j": torch's unpickler looked in its memo, a KeyError
def test_import_weights_says_a_file_is_neither_zip_nor_pickle(tmp_path, capsys, text):
    pytest.importorskip("torch")
    garbage = tmp_path / "g.pth"
    garbage.write_text(text)
    err = refused(["import-weights", "torchvision:resnet18", str(garbage), "--out", str(tmp_path / "iw8")], capsys)
    assert err == (f"hloforge: error: weights file {garbage} is not a PyTorch file: neither the zip archive "
                   "torch.save writes nor a pickle; expected a saved state dict (.safetensors, or torch.save's .pth)")
    assert not (tmp_path / "iw8").exists()


def test_import_weights_never_passes_on_torch_advice_or_warnings(tmp_path, capfd):
    """A protocol-4 pickle: torch's UserWarning and its source line came before the error, and the error
    quoted torch's advice to load with weights_only=False (which runs the file's code)."""
    pytest.importorskip("torch")
    p4 = tmp_path / "p4.pth"
    p4.write_bytes(pickle.dumps({"fc.weight": [1.0, 2.0]}, protocol=4))
    capfd.readouterr()
    assert main(["import-weights", "torchvision:resnet18", str(p4), "--out", str(tmp_path / "iw9")]) == 3
    cap = capfd.readouterr()
    err = cap.err.strip()
    assert err == (f"hloforge: error: weights file {p4} is a protocol-4 pickle, which torch's safe loader does "
                   "not read; save the state dict with torch.save's default "
                   "protocol, or as .safetensors"), err
    assert "weights_only" not in cap.out + cap.err and not (tmp_path / "iw9").exists()


def test_unpickling_refusal_drops_torchs_advice():
    from hloforge.interop.importer import _unpickling_refusal

    torch_said = ("Weights only load failed. In PyTorch 2.6, we changed the default value of the `weights_only` "
                  "argument in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set "
                  "to `False` will likely succeed, but it can result in arbitrary code execution. Do it only if you "
                  "got the file from a trusted source.\nPlease file an issue with the following so that we can make "
                  "`weights_only=True` compatible with your use case: WeightsUnpickler error: \n\nUnsupported "
                  "operand 103\n\nCheck the documentation of torch.load")
    assert _unpickling_refusal(torch_said) == "torch's safe loader: Unsupported operand 103"


# ------------------------------------------------------------------ 6. a file where a directory is expected
def test_a_file_where_a_directory_is_expected_is_said_so(tmp_path, capsys):
    a_file = tmp_path / "passwd"
    a_file.write_text("root\n")
    for argv, what in [(["render", "mnist-mlp", "--out", str(a_file)], "--out"),
                       (["train", "mnist-mlp", "--epochs", "1", "--no-progress", "--run-dir", str(a_file)],
                        "run directory")]:
        err = refused(argv, capsys)
        assert err == (f"hloforge: error: {what} {a_file} is a file, where a directory was expected; pass a "
                       "directory, or a path where one can be made"), err
        below = a_file / "x"
        err = refused([*argv[:-1], str(below)], capsys)
        assert err.startswith(f"hloforge: error: {what} {below}: {a_file} is a file, where a directory was "
                              "expected"), err
    assert a_file.read_text() == "root\n"


def test_a_path_the_system_refuses_says_where_and_what_was_expected(tmp_path, capsys) -> None:
    """Before: `hloforge: error: [Errno 1] Operation not permitted: '/sys/…'`, the errno first and no way out."""
    from hloforge.cli import main

    assert main(["render", "mnist-mlp", "--out", "/sys/hloforge-render-test"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("hloforge: error: /sys/hloforge-render-test: ") and "[Errno" not in err, err
    assert err.endswith(" not permitted; expected a path this user may write (or read)") or \
        err.endswith("permission denied; expected a path this user may write (or read)"), err


def test_three_misleading_lines_say_what_is_wrong(tmp_path, capsys, monkeypatch) -> None:
    """Before: a directory given as a spec file 'does not exist'; `eval --data-dir` on a run whose dataset takes
    no directory advised giving --data-dir; HLOFORGE_STRATEGY naming a kind twice took the later silently."""
    from hloforge.cli import main

    (tmp_path / "dir.json").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["summary", "dir.json"]) == 3
    assert "spec file 'dir.json' is a directory" in capsys.readouterr().err
    run = str(tmp_path / "run")
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", run, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", run, "--data-dir", str(tmp_path / "nope")]) == 3
    err = capsys.readouterr().err.strip()
    assert "dataset 'digits' reads no data dir" in err and "give where it is now" not in err, err
    monkeypatch.setenv("HLOFORGE_STRATEGY", "layout=nchw,layout=nhwc")
    assert main(["render", "mnist-mlp", "--out", str(tmp_path / "r")]) == 3
    assert "strategy layout given twice (nchw, nhwc); expected it once" in capsys.readouterr().err


def test_train_flags_that_would_do_nothing_are_refused(tmp_path, capsys) -> None:
    """Before: --cross-backend without --resume, a DDPM's --beta-start or --diffusion-steps on another net and
    --decay-rate under the cosine schedule were taken unsaid."""
    from hloforge.cli import main

    run = str(tmp_path / "run")
    for extra, said in ((["--cross-backend"], "--cross-backend lets --resume continue another backend's checkpoint"),
                        (["--beta-start", "0.01", "--beta-end", "0.2"], "--beta-start and --beta-end set a DDPM's "
                                                                         "noise schedule; net 'mnist-linear' is no "
                                                                         "DDPM"),
                        (["--diffusion-steps", "50"], "--diffusion-steps set a DDPM's noise schedule; net "
                                                      "'mnist-linear' is no DDPM"),
                        (["--decay-rate", "0.5", "--decay-epochs", "2"],
                         "--decay-rate and --decay-epochs set the exp schedule's decay, but the run's schedule is "
                         "'cosine'; expected --schedule exp with them")):
        assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", run, "--no-progress", *extra]) == 3
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    assert not os.path.exists(run)


def test_a_data_path_flag_the_dataset_reads_none_of_is_named_as_the_flag(tmp_path, capsys, mlp_run) -> None:
    """Before: `train --data-dir` on the digits said the dataset takes no option 'data_dir' (a name the user never
    wrote), and `eval RUN --data-dir` blamed the run's checkpoint for it."""
    from hloforge.cli import main

    run = str(tmp_path / "run")
    assert main(["train", "mnist-mlp", "--epochs", "1", "--data-dir", str(tmp_path), "--run-dir", run,
                 "--no-progress"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (f"hloforge: error: --data-dir {tmp_path}: dataset 'digits' reads no data dir (its options are "
                   "['size', 'channels']); expected no --data-dir for it"), err
    assert not os.path.exists(run)
    assert main(["eval", mlp_run, "--data-file", str(tmp_path / "x.txt")]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hloforge: error: --data-file {tmp_path / 'x.txt'}: dataset 'digits' reads no data "
                          "file"), err
    assert main(["train", "tinygpt-nano", "--data", "text", "--data-dir", str(tmp_path), "--run-dir", run,
                 "--no-progress"]) == 3
    assert capsys.readouterr().err.strip().endswith("; expected --data-file for it")


def test_hloforge_backend_naming_no_backend_is_named_as_the_variable(tmp_path, capsys, monkeypatch) -> None:
    """Before: HLOFORGE_BACKEND=xl said "unknown backend 'xl'", as if --backend had been given."""
    from hloforge.cli import main
    from hloforge.core.errors import SettingError
    from hloforge.train.session import make_backend

    monkeypatch.setenv("HLOFORGE_BACKEND", "xl")
    run = str(tmp_path / "run")
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", run, "--no-progress"]) == 3
    said = ("HLOFORGE_BACKEND='xl': no backend of that name is registered; expected one of ['iree', 'xla'], or the "
            "variable unset (xla)")
    assert capsys.readouterr().err.strip() == f"hloforge: error: {said}"
    with pytest.raises(SettingError, match="HLOFORGE_BACKEND='xl'"):
        make_backend()
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", run, "--no-progress", "--backend", "xla"]) == 0


def test_a_folder_that_is_no_run_is_said_with_what_it_holds(tmp_path, capsys, mlp_run) -> None:
    """Before: `hloforge eval runs` (the folder of runs) or an export directory said only that
    DIR/checkpoint.safetensors does not exist."""
    from hloforge.cli import main

    runs = os.path.dirname(mlp_run)
    assert main(["eval", runs]) == 3
    assert capsys.readouterr().err.strip() == (
        f"hloforge: error: {runs} holds no checkpoint.safetensors; expected a run directory (that hloforge train, "
        f"import-weights or Model.save wrote) or a checkpoint file; it holds run directories: {mlp_run}")
    out = str(tmp_path / "exported")
    assert main(["export", mlp_run, "--out", out]) == 0
    capsys.readouterr()
    assert main(["cam", out, "test:0"]) == 3
    assert capsys.readouterr().err.strip().endswith("; it is an export (manifest.json), whose weights `train --init` "
                                                    "reads")


def test_a_run_stopped_before_its_first_checkpoint_is_said_as_one(tmp_path, capsys, mlp_run) -> None:
    """A run directory killed during its first epoch (config.toml, metrics, no checkpoint yet: one is written as
    each epoch ends) was refused as 'expected a run directory', as if it were none; it now says why it has none."""
    import shutil

    import hloforge as hf

    stopped = str(tmp_path / "stopped")
    os.mkdir(stopped)
    shutil.copy(os.path.join(mlp_run, "config.toml"), stopped)
    said = ("; it is a run with no checkpoint yet: one is written as each epoch ends, so a run stopped before its "
            "first epoch ended kept none (train it again; one still running has one after that epoch)")
    assert main(["eval", stopped]) == 3
    assert capsys.readouterr().err.strip().endswith(said)
    with pytest.raises(hf.HloforgeError) as e:
        hf.load(stopped)
    assert str(e.value).endswith(said)


@pytest.mark.parametrize("fmt", ["hloforge", "torchvision"])
def test_an_export_out_named_as_a_weights_file_is_refused(fmt, tmp_path, capsys, mlp_run) -> None:
    """`export RUN --out model.safetensors` (import-weights' --out for bare weights) made a folder of that name,
    the weights inside it. Now refused, saying export writes a directory, before anything is written."""
    out = tmp_path / "model.safetensors"
    assert main(["export", mlp_run, "--out", str(out), "--format", fmt]) == 3
    inside = "model.safetensors" if fmt != "hloforge" else "forward.mlir, weights.safetensors, manifest.json"
    assert capsys.readouterr().err == (f"hloforge: error: --out {out} names a .safetensors file, but export writes a "
                                       f"directory ({inside}); expected a directory name\n")
    assert not out.exists()


def test_a_train_run_dir_named_as_a_weights_file_is_refused(tmp_path, capsys) -> None:
    """`train --run-dir w.safetensors` made a run directory of that name, which `Model.save("w.safetensors")`
    refuses; now refused the same way, before the data is read or anything is written."""
    run = tmp_path / "w.safetensors"
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir", str(run)]) == 3
    assert capsys.readouterr().err == (f"hloforge: error: run directory {run} names a .safetensors file, but a save "
                                       "is a run directory (config.toml + checkpoint.safetensors, which holds the "
                                       f"weights) that hf.load(DIR) reads back; give a directory path, e.g. "
                                       f"{str(tmp_path / 'w')!r}\n")
    assert not run.exists()


def test_a_path_written_with_equals_and_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch, capsys) -> None:
    """`--run-dir=~/r` reaches hloforge unexpanded (the shell expands `~` only at a word's start): it made a folder
    named `~` in the current one. Every path argument now takes a leading `~` as the home folder, as hf.load and
    Model.save do."""
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    assert main(["train", "mnist-linear", "--epochs", "1", "--run-dir=~/r"]) == 0
    assert (home / "r" / "checkpoint.safetensors").is_file() and not (here / "~").exists()
    capsys.readouterr()
    assert main(["eval", "~/r"]) == 0
    assert main(["export", "~/r", "--out=~/e"]) == 0
    assert (home / "e" / "manifest.json").is_file() and not (here / "~").exists()


def test_a_checkpoint_that_is_a_directory_is_said_without_an_errno(mlp_run, tmp_path, capsys):
    """A run whose checkpoint.safetensors is a folder: its OSError was quoted whole ('([Errno 21] Is a
    directory: PATH)'), the path twice, as if the file were truncated."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(os.path.join(mlp_run, "config.toml"), run)
    (run / "checkpoint.safetensors").mkdir()
    err = refused(["eval", str(run)], capsys)
    assert err == (f"hloforge: error: checkpoint {run / 'checkpoint.safetensors'} cannot be read (is a directory); "
                   "expected a safetensors file")


@pytest.mark.parametrize("line,said", [
    ("replicas = 0", "replicas must be positive, got 0"),  # was '... got replicas=0 devices=None'
    ("devices = 0", "devices must be from 1 to 1024, got 0"),
    ("devices = 2000", "devices must be from 1 to 1024, got 2000"),  # the command line's bound (MAX_PROCESSES)
    ("workers = 1500", "workers must be from 0 to 1024, got 1500"),  # forked 1500 producers
    ("epochs = 0", "epochs must be a positive integer, got 0"),
    ("decay_epochs = 0.0", "decay_epochs must be positive, got 0.0"),
])
def test_a_config_value_out_of_range_names_that_value_alone(tmp_path, capsys, line, said):
    """Two options were checked in one clause and both shown, the one not set as None."""
    config = tmp_path / "config.toml"
    config.write_text(f'net = "mnist-linear"\n{line}\n')
    assert refused(["train", "--config", str(config), "--run-dir", str(tmp_path / "r")], capsys) == \
        f"hloforge: error: {said}"
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("line,near", [
    ("sed = 1", "; did you mean 'seed'?"),
    ('data-dir = "d"', "; did you mean 'data_dir'?"),  # a flag's spelling, copied into the file
    ("zzzq = 1", ""),
])
def test_a_config_key_misspelt_is_named_for_what_it_likely_is(tmp_path, capsys, line, near):
    config = tmp_path / "config.toml"
    config.write_text(f'net = "mnist-linear"\n{line}\n')
    err = refused(["train", "--config", str(config), "--run-dir", str(tmp_path / "r")], capsys)
    key = line.split(" =")[0]
    assert err.startswith(f"hloforge: error: config {config}: unknown key(s) [{key!r}]; expected some of [")
    assert err.endswith("'workers']" + near)


def test_a_spec_file_given_as_the_config_says_so(tmp_path, capsys):
    """Was 'unknown key(s) ['input_shape', 'layers', 'name', 'num_classes']; expected some of [46 keys]'."""
    spec = tmp_path / "net.toml"
    spec.write_text('name = "n"\ninput_shape = [4]\nnum_classes = 2\n[[layers]]\nkind = "dense"\nunits = 2\n')
    err = refused(["train", "--config", str(spec), "--run-dir", str(tmp_path / "r")], capsys)
    assert err == (f"hloforge: error: config {spec} is a net's spec file (name, input_shape, num_classes, layers), "
                   f"not train's options; give it as the net (`hloforge train {spec}`), or name it in a config: "
                   f'net = "{spec}"')


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "eval_correct.npz"])
def test_a_run_file_given_as_the_checkpoint_points_at_the_run(mlp_run, capsys, name):
    """Was 'checkpoint RUN/config.toml is truncated or not a safetensors file (Error while deserializing:
    header too large)': the file tab-completed one step too far is the run's own, not a damaged checkpoint."""
    err = refused(["eval", os.path.join(mlp_run, name)], capsys)
    assert err == (f"hloforge: error: {os.path.join(mlp_run, name)} is a file of run directory {mlp_run}, not a "
                   f"checkpoint; expected the run directory ({mlp_run}) or its checkpoint.safetensors")


def test_a_foreign_file_in_a_run_directory_is_said_as_what_it_is(mlp_run, tmp_path, capsys):
    """A .pth someone put in a run directory is no file of the run's: said as a PyTorch pickle, as anywhere."""
    pth = os.path.join(mlp_run, "w.pth")
    with open(pth, "wb") as f:
        f.write(b"PK\x03\x04 not really")
    try:
        assert "is a PyTorch pickle, not an hloforge checkpoint" in refused(["eval", pth], capsys)
    finally:
        os.remove(pth)


def test_a_run_directory_given_as_the_net_says_it_is_a_directory(mlp_run, capsys):
    """Was "net 'RUN': a spec file must end in .toml or .json, and no zoo net is named so"."""
    assert refused(["summary", mlp_run], capsys) == (
        f"hloforge: error: net {mlp_run!r} is a directory; expected a zoo name or a .toml/.json spec file (a run's "
        "net is the `net` of its config.toml)")
