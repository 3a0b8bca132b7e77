"""The plugin registry: entry points loaded into a pluggy PluginManager, looked up by name.

A plugin that cannot be loaded (its import raises, its hook functions fit no hook — misspelt, not
decorated, other arguments —, its hook raises or returns something that is not a list of components,
it declares another plugin API than `hloforge.PLUGIN_API_VERSION`, its strategy kind takes a core kind's
name, or its backend's `strategy_defaults` name a kind or choice nobody declares)
is not registered: it is recorded in `Registry.broken` with its distribution and the error,
a `PluginLoadWarning` says so once, and every other plugin still loads.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

import attrs
import pluggy

from hloforge.core import contracts, hookspecs
from hloforge.core.contracts import check_constructor_options
from hloforge.core.errors import HloforgeWarning, PluginError, UnsupportedSpec
from hloforge.core.switches import env_switch


def hloforge_version() -> str:
    """The installed hloforge distribution's version (pyproject.toml's): hloforge.__version__, `hloforge --version`
    and what a run's config.toml and checkpoint record."""
    try:
        return version("hloforge")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "unknown (not installed)"


# kind -> (entry-point group, hook that lists its components, attribute holding a component's name)
KINDS: dict[str, tuple[str, str, str]] = {
    "layer": ("hloforge.layers", "hloforge_layers", "kind"),
    "loss": ("hloforge.losses", "hloforge_losses", "name"),
    "optimizer": ("hloforge.optimizers", "hloforge_optimizers", "name"),
    "backend": ("hloforge.backends", "hloforge_backends", "name"),
    "dataset": ("hloforge.datasets", "hloforge_datasets", "name"),
    "callback": ("hloforge.callbacks", "hloforge_callbacks", "name"),
    # the lowering strategy kinds a layer (or loss) plugin's forms consult (core/strategy.py)
    "strategy": ("hloforge.layers", "hloforge_strategy_kinds", "name"),
}
# the base class a kind's components must subclass (None: any class; backends and datasets satisfy a protocol)
CONTRACTS: dict[str, type | None] = {"layer": contracts.Layer, "loss": contracts.Loss,
                                     "optimizer": contracts.Optimizer, "backend": None, "dataset": None,
                                     "callback": None}
TRACE_ENV_VAR = "HLOFORGE_TRACE_PLUGINS"
BUILTIN_DISTRIBUTION = "hloforge"  # the distribution whose entry points are hloforge's own components


@attrs.frozen
class Entry:
    kind: str
    name: str
    obj: Any
    distribution: str  # a component registered in process: the module defining its class
    plugin: str
    in_process: bool = False  # registered by the running program (`hf.register`), not by an entry point
    gated: bool = False  # its gate passed as `hf.register` registered it (gate=False, or a plugin's: not run then)

    @property
    def origin(self) -> str:
        """Where a message says the component comes from: its distribution, or this program (its `distribution`
        then a module, which no pip install provides)."""
        return "registered by this program: hf.register" if self.in_process else f"distribution {self.distribution!r}"

    @property
    def builtin(self) -> bool:
        """hloforge's own component (its entry points are hloforge's distribution's)."""
        return self.distribution == BUILTIN_DISTRIBUTION


class PluginLoadWarning(HloforgeWarning):
    """A plugin was skipped (it is listed in `Registry.broken`); the others loaded."""


@attrs.frozen
class BrokenPlugin:
    """A plugin that was not registered: `plugin` is "dist:group:entry-point", `error` one line."""

    plugin: str
    distribution: str
    error: str

    @property
    def name(self) -> str:
        return self.plugin.rsplit(":", 1)[-1]


class NameClash(PluginError):
    """Two plugins claim one name: every command that needs the registry refuses (`hloforge plugins`
    lists them instead, through `Registry(keep_clashes=True)`)."""


@attrs.frozen
class Clash:
    """One name claimed by two plugins: `first` keeps it in a registry that lists clashes (hloforge's own
    component where it is one of the two, else the first loaded)."""

    first: Entry
    second: Entry

    @property
    def message(self) -> str:
        a, b = self.first, self.second
        return (f"{a.kind} {a.name!r} is claimed twice: by distribution {a.distribution!r} ({a.plugin}) "
                f"and by {b.distribution!r} ({b.plugin})")


class Registry:
    def __init__(self, extra_plugins: tuple[tuple[Any, str], ...] = (), kinds: Sequence[str] | None = None,
                 keep_clashes: bool = False):
        """Load every entry point; `extra_plugins` (module, distribution) serve tests. `kinds` (default
        all) limits the registry to those kinds' entry-point groups: a process that only needs datasets
        (a streaming producer) then imports no layer, loss or backend module. A name two plugins claim
        is a NameClash (a PluginError), unless `keep_clashes` (`hloforge plugins`, which must still
        list what is installed): then it is listed in `clashes` and one claimant keeps it."""
        self.keep_clashes = keep_clashes
        self.clashes: list[Clash] = []
        self.kinds = tuple(KINDS) if kinds is None else tuple(kinds)
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise PluginError(f"unknown component kind(s) {unknown}; expected some of {list(KINDS)}")
        self.pm = pluggy.PluginManager("hloforge")
        self.pm.add_hookspecs(hookspecs)
        if env_switch(TRACE_ENV_VAR, on="print every plugin hook call", error=PluginError):
            self.pm.add_hookcall_monitoring(_trace_before, _trace_after)
        self._dist: dict[str, str] = {}
        self.broken: list[BrokenPlugin] = []
        for group in dict.fromkeys(KINDS[kind][0] for kind in self.kinds):  # each group once
            for ep in entry_points(group=group):
                dist = ep.dist.name if ep.dist is not None else "?"
                name = f"{dist}:{group}:{ep.name}"
                try:
                    module = ep.load()
                except Exception as e:  # a third party's import error must not take the others down
                    self._broken(name, dist, f"cannot import {ep.value!r}: {type(e).__name__}: {e}")
                    continue
                self._register(module, name, dist)
        for module, dist in extra_plugins:
            self._register(module, f"{dist}:{module.__name__}", dist)
        self._tables: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        for kind, (_, hook, attr) in ((k, KINDS[k]) for k in self.kinds):
            impls = getattr(self.pm.hook, hook).get_hookimpls()
            for impl in impls:
                # One plugin at a time, so each component keeps its distribution; through the hook caller
                # (not impl.function()) so hook-call monitoring (HLOFORGE_TRACE_PLUGINS) sees every call.
                others = [i.plugin for i in impls if i.plugin is not impl.plugin]
                try:
                    found = [Entry(kind, _component_name(obj, kind, attr), obj, self._dist[impl.plugin_name],
                                   impl.plugin_name)
                             for result in self.pm.subset_hook_caller(hook, others)()
                             for obj in _returned_list(result)]
                except Exception as e:
                    what = str(e) if isinstance(e, PluginError) else f"failed: {type(e).__name__}: {e}"
                    self._broken(impl.plugin_name, self._dist[impl.plugin_name], f"{hook}() {what}")
                    continue
                for entry in found:
                    self._add(entry)  # a name claimed twice is an error, never a skipped plugin
        if "backend" in self.kinds:
            self._check_strategies()

    def _check_strategies(self) -> None:
        """Mark broken a plugin whose strategy kind takes a core kind's name (or has no choices), or whose
        backend's `strategy_defaults` is no mapping or names a kind or choice nobody declares: read when a
        net is rendered, it would refuse every net for every backend, and blame the layers being rendered."""
        core, kinds = contracts.CORE_STRATEGY_CHOICES, self._tables["strategy"]
        for e in list(kinds.values()):
            choices = getattr(e.obj, "choices", None)
            if e.name in core:
                why = f"which takes the name of one of the core's kinds {list(core)}; expected a name of its own"
            elif not isinstance(choices, tuple) or not choices or not all(isinstance(c, str) for c in choices):
                why = f"whose choices are {choices!r}; expected a hloforge.core.strategy.StrategyKind"
            else:
                continue
            if kinds.get(e.name) is e:  # (not its plugin's second kind, already dropped with the first)
                self._broken(e.plugin, e.distribution, f"hloforge_strategy_kinds() returned strategy kind "
                                                       f"{e.name!r}, {why}")
        choices_of = {**core, **{n: e.obj.choices for n, e in kinds.items()}}
        for e in list(self._tables["backend"].values()):
            defaults = getattr(e.obj, "strategy_defaults", None)
            if defaults is None or self._tables["backend"].get(e.name) is not e:
                continue  # None: not a render target, it gets the portable forms
            if not isinstance(defaults, Mapping):
                why = f"is {defaults!r} (type {type(defaults).__name__}); expected a mapping strategy kind -> choice"
            elif "strategy" in self.kinds:  # (a registry without the layer plugins' kinds cannot check them)
                bad = [f"{k}={c!r} (its choices: {list(choices_of[k])})" if k in choices_of
                       else f"{k}={c!r} (no such kind; the kinds: {sorted(choices_of)})"
                       for k, c in defaults.items() if k not in choices_of or c not in choices_of[k]]
                if not bad:
                    continue
                why = "names an unknown kind or choice: " + "; ".join(bad)
            else:
                continue
            self._broken(e.plugin, e.distribution, f"hloforge_backends() returned backend {e.name!r}, whose "
                                                   f"strategy_defaults {why}")

    def _register(self, module: Any, plugin_name: str, dist: str) -> None:
        if self.pm.get_plugin(plugin_name) is None and not self.pm.is_registered(module):
            ours = hookspecs.PLUGIN_API_VERSION
            api = getattr(module, "HLOFORGE_PLUGIN_API", ours)
            if not isinstance(api, int) or isinstance(api, bool):
                self._broken(plugin_name, dist, f"module {module.__name__!r} sets HLOFORGE_PLUGIN_API = {api!r} "
                                                f"(type {type(api).__name__}); expected an int, the plugin API it "
                                                f"targets (this hloforge provides {ours})")
                return
            if api != ours:
                self._broken(plugin_name, dist, f"module {module.__name__!r} targets hloforge plugin API {api!r}, "
                                                f"but this hloforge provides plugin API {ours}; "
                                                f"install a release of {dist!r} made for plugin API "
                                                f"{ours} (or an hloforge that provides {api!r})")
                return
            try:
                self.pm.register(module, name=plugin_name)
            except pluggy.PluginValidationError as e:  # a hook function whose arguments are not its hook's
                self._broken(plugin_name, dist, f"module {module.__name__!r} does not fit hloforge's hooks: {e}")
                return
            self._dist[plugin_name] = dist
            wrong = _hook_mistakes(module, self.pm)
            if wrong:
                self._broken(plugin_name, dist, f"module {module.__name__!r} {wrong}")

    def _broken(self, plugin_name: str, dist: str, error: str) -> None:
        if self.pm.get_plugin(plugin_name) is not None:
            self.pm.unregister(name=plugin_name)  # its other hooks must not run either
        for kind in getattr(self, "_tables", {}).values():  # drop what it registered under earlier hooks
            for name in [n for n, e in kind.items() if e.plugin == plugin_name]:
                del kind[name]
        error = " ".join(error.split())  # one line
        self.broken.append(BrokenPlugin(plugin_name, dist, error))
        warnings.warn(f"hloforge plugin {plugin_name} (distribution {dist!r}) was not loaded: {error}",
                      PluginLoadWarning, stacklevel=3)

    def _add(self, e: Entry) -> None:
        table = self._tables[e.kind]
        prev = table.get(e.name)
        if prev is not None and prev.obj is not e.obj:
            if not self.keep_clashes:
                raise NameClash(Clash(prev, e).message)
            # hloforge's own component keeps its name: the listing then shows the newcomer as the clash
            builtin_second = e.builtin and not prev.builtin
            kept, other = (e, prev) if builtin_second else (prev, e)
            table[e.name] = kept
            self.clashes.append(Clash(kept, other))
            return
        table[e.name] = e

    def get(self, kind: str, name: str) -> Any:
        return self.entry(kind, name).obj

    def in_process_entry(self, kind: str, cls: Any) -> Entry:
        """The entry `cls`, a class the running program defines, would have as a `kind` component (not yet
        added: `add_in_process`). Its name is checked as a plugin's; a name another component holds is a
        NameClash, but the same class defined again (a notebook's cell run twice) takes its name back."""
        name = _component_name(cls, kind, KINDS[kind][2], "hf.register got")
        where = f"{cls.__module__}.{cls.__qualname__}"
        prev = self.find(kind, name)
        if prev is not None and prev.obj is not cls and not (prev.in_process and prev.plugin == where):
            holder = f"{prev.obj.__module__}.{prev.obj.__qualname__}" if isinstance(prev.obj, type) else repr(prev.obj)
            raise NameClash(f"{kind} {name!r} is already {holder} ({prev.origin}); give "
                            f"{cls.__name__} a {KINDS[kind][2]} of its own")
        return prev if prev is not None and prev.obj is cls else Entry(kind, name, cls, cls.__module__, where, True)

    def find(self, kind: str, name: str) -> Entry | None:
        """The entry registered under `name`, or None (`entry` refuses an unknown name)."""
        return self._table(kind).get(name)

    def add_in_process(self, entry: Entry) -> None:
        self._table(entry.kind)[entry.name] = entry

    def _table(self, kind: str) -> dict[str, Entry]:
        if kind not in self.kinds:
            raise PluginError(f"this registry loads only the {list(self.kinds)} plugins, not {kind!r}")
        return self._tables[kind]

    def entry(self, kind: str, name: str) -> Entry:
        table = self._table(kind)
        if name not in table:
            known = ", ".join(f"{n} ({e.distribution})" for n, e in sorted(table.items())) or "none"
            broken = "".join(f"; not loaded: {b.plugin} ({b.error})" for b in self.broken)
            # another framework's name of a registered one: that one, not the closest spelling (another loss)
            said = _folded(name)  # Keras's class name too: CategoricalCrossentropy is categorical_crossentropy
            same = [n for n, e in sorted(table.items()) if said in map(_folded, getattr(e.obj, "also_known_as", ()))]
            hint = f"; {name!r} is {kind} {same[0]!r} here" if same else near_name(name, table)
            raise PluginError(f"unknown {kind} {name!r}; registered: {known}{broken}{hint}")
        return table[name]

    def make(self, kind: str, name: str, **options: Any) -> Any:
        """An instance of the named component; an option it does not take is one clear error."""
        cls = self.get(kind, name)
        check_constructor_options(kind, name, cls, options)
        try:
            return cls(**options)
        except (TypeError, ValueError) as e:
            raise UnsupportedSpec(f"{kind} {name!r}: {e}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(self._table(kind))

    def entries(self) -> Iterator[Entry]:
        for kind in KINDS:
            for name in sorted(self._tables[kind]):
                yield self._tables[kind][name]

    def at_fault(self, e: BaseException) -> Entry | None:
        """The third-party plugin whose own code raised `e`, else None (hloforge's code, or no plugin's).

        Read off the traceback, innermost frame first; frames of other libraries (numpy, the standard
        library) are passed over, so the first frame that is hloforge's or a third-party plugin's decides:
        hloforge's is hloforge's bug (but for a contract method the plugin left out: the base's
        NotImplementedError); a plugin's is the component whose class (or a base of it the plugin
        defines) holds the code, or whose caller out from there is one; a hook function is a `hook` entry;
        code of a plugin's module that no component calls, a `module` entry."""
        classes, hooks, modules = self._plugin_code()
        frames = [frame for frame, _ in traceback.walk_tb(e.__traceback__)][::-1]
        for i, frame in enumerate(frames):
            path = _source(frame.f_code.co_filename)
            if path in modules:
                for outer in frames[i:]:
                    found = _component_of(outer, classes, hooks)
                    if found is not None:
                        return found
                module, dist = modules[path]
                return Entry("module", module, None, dist, "")
            if path.startswith(_OWN):
                me = frame.f_locals.get("self")
                if isinstance(e, NotImplementedError) and path == _source(contracts.__file__) and me is not None:
                    return next((c for c in self.entries() if c.obj is type(me) and not c.builtin), None)
                return None
        return None

    def _plugin_code(self) -> tuple[dict[str, list[tuple[str, Entry]]], dict[Any, Entry], dict[str, tuple[str, str]]]:
        """Where the third-party plugins' code is: by source file, (class qualified name, component) for
        each component's class and the bases its distribution defines; each hook function's code object;
        each such file's (module, distribution)."""
        classes: dict[str, list[tuple[str, Entry]]] = {}
        modules: dict[str, tuple[str, str]] = {}
        for entry in self.entries():
            if entry.builtin:
                continue
            for cls in (entry.obj if isinstance(entry.obj, type) else type(entry.obj)).__mro__:
                path = _source(getattr(sys.modules.get(cls.__module__), "__file__", None))
                if path and not path.startswith(_OWN):
                    classes.setdefault(path, []).append((cls.__qualname__, entry))
                    modules[path] = (cls.__module__, entry.distribution)
        hooks: dict[Any, Entry] = {}
        for plugin_name, dist in self._dist.items():
            module = self.pm.get_plugin(plugin_name)
            path = _source(getattr(module, "__file__", None))
            if dist == BUILTIN_DISTRIBUTION or module is None or not path or path.startswith(_OWN):
                continue
            modules[path] = (module.__name__, dist)
            for caller in self.pm.get_hookcallers(module) or ():
                for impl in caller.get_hookimpls():
                    code = getattr(impl.function, "__code__", None)  # None: a callable object, named by its class
                    if impl.plugin is module and code is not None:
                        hooks[code] = Entry("hook", caller.name, impl.function, dist, plugin_name)
        return classes, hooks, modules


# hloforge's own source (the package's directory): code there is never a plugin's
_OWN = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def _source(path: str | None) -> str:
    return os.path.realpath(path) if path else ""


def _component_of(frame: Any, classes: Mapping[str, list[tuple[str, Entry]]],
                  hooks: Mapping[Any, Entry]) -> Entry | None:
    """The component whose class's code (a method, or a function defined in one) `frame` runs, or the
    hook function it is; where one base class of the plugin's serves several, the one `self` is."""
    code = frame.f_code
    if code in hooks:
        return hooks[code]
    found = [e for qualname, e in classes.get(_source(code.co_filename), ())
             if code.co_qualname.startswith(qualname + ".")]
    me = frame.f_locals.get("self", frame.f_locals.get("cls"))
    mine = [e for e in found if e.obj is me or e.obj is type(me)] or found
    return mine[0] if mine else None


def _folded(name: object) -> str:
    """A name as another framework's names are matched: without case or underscores."""
    return str(name).lower().replace("_", "")


def near_name(name: str, names: Collection[str]) -> str:
    """A misspelt name's likeliest meaning, as a phrase to end its refusal with ("" when none is near): at the
    end, as the list of every registered name before it is long. Matched without case (`maxpool`, `Conv2D`)."""
    lower = {n.lower(): n for n in names}
    near = difflib.get_close_matches(str(name).lower(), lower, n=1)
    return f"; did you mean {lower[near[0]]!r}?" if near else ""


def _hook_mistakes(module: Any, pm: pluggy.PluginManager) -> str:
    """What keeps a plugin module's hooks from ever being called, as a phrase after its name ("" when
    nothing does): a decorated function named after no hook (a typo), or no decorated hook at all."""
    hooks = [n for n in dir(hookspecs) if n.startswith("hloforge_")]
    for caller in pm.get_hookcallers(module) or ():
        if caller.spec is None:
            near = difflib.get_close_matches(caller.name, hooks, n=1)
            hint = f"did you mean {near[0]}?" if near else f"the hooks are {', '.join(hooks)}"
            return f"implements {caller.name}, which is not a hloforge hook ({hint})"
    if pm.get_hookcallers(module):
        return ""
    bare = [n for n in hooks if callable(getattr(module, n, None))]
    if bare:
        return f"defines {', '.join(bare)} without the @hookimpl decorator (hloforge.core.hookspecs.hookimpl)"
    return f"implements no hloforge hook; expected a function decorated with @hookimpl named one of {', '.join(hooks)}"


def _returned_list(result: Any) -> Sequence[Any]:
    """A hook's result, which must be a list (None: the hook provides nothing)."""
    if result is None:
        return ()
    if not isinstance(result, (list, tuple)):
        raise PluginError(f"returned {result!r}, expected a list of classes (`return [{result.__name__}]`)"
                          if isinstance(result, type) else f"returned {result!r}, expected a list")
    return result


def _component_name(obj: Any, kind: str, attr: str, said: str = "returned") -> str:
    """`obj`'s name as a `kind` component, or a PluginError starting `said` (what a plugin's hook did with it)."""
    a = "an" if kind[0] in "aeiou" else "a"
    base = CONTRACTS.get(kind)
    if kind in CONTRACTS:  # a strategy kind is an instance; every other component is a class
        if not isinstance(obj, type):
            raise PluginError(f"{said} {obj!r}, which is not {a} {kind} component: an instance, expected its "
                              "class (hloforge makes the instances)")
        if base is not None and not issubclass(obj, base):
            raise PluginError(f"{said} {obj!r}, which is not {a} {kind} component: expected a subclass of "
                              f"hloforge.core.contracts.{base.__name__}")
    name = getattr(obj, attr, None)
    if not isinstance(name, str) or not name:
        if isinstance(obj, type) and attrs.has(obj) and attr in attrs.fields_dict(obj):  # `name: str = "x"`
            raise PluginError(f"{said} {obj!r}, which is not {a} {kind} component: its {attr!r} is annotated, so "
                              f"attrs made it an option, not the class's {attr}; declare it a plain class attribute "
                              f"(`{attr} = ...`) or a ClassVar (`{attr}: ClassVar[str] = ...`)")
        raise PluginError(f"{said} {obj!r}, which is not {a} {kind} component: it has no string attribute {attr!r}")
    # a tuple of names written without its comma, `("mom")`, is a string: each letter would be taken for a name
    for field in [n for n, t in getattr(base, "__annotations__", {}).items() if t == "ClassVar[tuple[str, ...]]"]:
        v = getattr(obj, field, ())
        if isinstance(v, str):
            raise PluginError(f"{said} {kind} {name!r}, whose {field} is the string {v!r}; expected a tuple of "
                              f"names (one name is `({v!r},)`, with the comma)")
    return name


def _trace_before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, object]) -> None:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    plugins = ", ".join(i.plugin_name for i in impls) or "no plugin"
    print(f"hloforge trace: {hook_name}({args}) -> [{plugins}]", file=sys.stderr)


def _trace_after(outcome: pluggy.Result[object], hook_name: str, impls: Sequence[pluggy.HookImpl],
                 kwargs: Mapping[str, object]) -> None:
    if outcome.exception is not None:
        print(f"hloforge trace: {hook_name} raised {outcome.exception!r}", file=sys.stderr)
    else:
        print(f"hloforge trace: {hook_name} returned {outcome.get_result()!r}", file=sys.stderr)


def plugin_label(kind: str, name: str, dist: str) -> str:
    """How a message names a plugin's component: `layer 'x' (dist 'y')`."""
    return f"{kind} {name!r} (dist {dist!r})"


def component_label(kind: str, obj: Any) -> str:
    """`plugin_label` of a component (its class or an instance), its distribution read off the loaded
    default registry; `layer 'x'` for one it does not hold (a class the caller made, no registry yet)."""
    cls = obj if isinstance(obj, type) else type(obj)
    name = getattr(cls, KINDS[kind][2], cls.__name__)
    if default_registry.cache_info().currsize:  # never load the plugins just to name one
        for e in default_registry().entries():
            if e.kind == kind and e.obj is cls:
                return plugin_label(kind, name, e.distribution)
    return f"{kind} {name!r}"


class _OneRegistry:
    """`default_registry()`: the registry, built by the first call and kept (`cache_clear` and `cache_info` as
    functools.cache's), one however many threads make that first call at once: functools.cache alone builds one per
    such thread and keeps the last, and what `hf.register` added to another was lost."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: a plugin whose import asks for the registry is answered as before
        self._kept = functools.cache(Registry)
        self.cache_clear, self.cache_info = self._kept.cache_clear, self._kept.cache_info

    def __call__(self) -> Registry:
        with self._lock:
            return self._kept()


default_registry = _OneRegistry()


@functools.cache
def dataset_registry() -> Registry:
    """The dataset plugins alone: what a streaming producer needs to rebuild its dataset. It finds
    every dataset registered under the datasets entry-point group; a caller that misses a name here
    asks `default_registry()`, which also sees a dataset a module registered under another group."""
    return Registry(kinds=("dataset",))
