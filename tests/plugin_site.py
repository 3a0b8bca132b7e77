"""A "pip-installed" distribution, as the plugin tests make one: its modules and a `<name>.dist-info`
(METADATA, entry_points.txt) in a directory put first on sys.path or PYTHONPATH, which is exactly what
importlib.metadata reads for an installed wheel."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def fake_dist(site: Path, dist: str, modules: dict[str, str], entry_points: dict[str, dict[str, str]]) -> None:
    """Write modules and a dist-info for distribution `dist` into `site` (entry points: group -> name -> target)."""
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()))
    for name, text in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(text))


def env_with(*paths: Path) -> dict[str, str]:
    """This process's environment with `paths` first on PYTHONPATH, and no plugin tracing asked for."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("HLOFORGE_TRACE_PLUGINS", None)
    return env


def installed_in_process(site: Path, tmp_path: Path, monkeypatch: Any) -> Iterator[None]:
    """`site` importable in this process, the default registry built afresh with it and dropped after (a
    fixture's body: `yield from installed_in_process(site, tmp_path, monkeypatch)`)."""
    from hloforge.core import registry

    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HLOFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HLOFORGE_DEBUG", raising=False)
    registry.default_registry.cache_clear()
    yield
    registry.default_registry.cache_clear()


# A plugin layer module of one layer, `kind`, that doubles its input (gated against its reference), and its hook.
def layer_module(kind: str, header: str = "") -> str:
    return textwrap.dedent(header) + textwrap.dedent(f'''
        import attrs
        from hloforge.core.hookspecs import hookimpl
        from hloforge.core.spec import Layer


        @attrs.frozen
        class Scale(Layer):
            kind = "{kind}"

            def out_shape(self, in_shape):
                return in_shape

            def forward(self, b, x, params, ctx):
                return x * 2.0

            def reference(self, params, x, ctx):
                return 2.0 * x

            @classmethod
            def gate_cases(cls):
                return [(cls(), (3,))]


        @hookimpl
        def hloforge_layers():
            return [Scale]
        ''')
