"""The exception hierarchy: every error is one clear line naming what is wrong."""

from __future__ import annotations

import errno

#: the errnos of a write the disk had no room for (a full disk, a quota, a file-size limit)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class HloforgeError(Exception):
    """Base of every error hloforge raises on purpose."""


class HloforgeWarning(UserWarning):
    """Base of hloforge's warnings: the work goes on, and the command line prints each as one line."""


class UnsupportedSpec(HloforgeError):
    """A spec (or an option in it) that no plugin can render faithfully."""


class PluginError(HloforgeError):
    """A plugin lookup failed, or two plugins claim one name."""


class BackendError(HloforgeError):
    """A backend could not load, compile or run; carries the backend's own message."""


class DeviceMemoryError(BackendError):
    """A backend ran out of memory running a module. `needed`: the bytes of the allocation it was refused, where
    the backend says (else None); the sessions say it again with the batch that asked (`hloforge.train.session`)
    and `advice`, what to reduce, said last: a command without the batch option advised names its own (`advise`)."""

    def __init__(self, message: str, needed: int | None = None, advice: str = "") -> None:
        super().__init__(f"{message}; {advice}" if advice else message)
        self.said, self.needed, self.advice = message, needed, advice

    def advise(self, advice: str) -> None:
        """Say `advice` instead of its own (the error itself kept: what else was set on it on the way up)."""
        self.advice, self.args = advice, (f"{self.said}; {advice}",)


class DataError(HloforgeError):
    """A data file or array that is malformed, truncated or of the wrong shape."""


class SettingError(HloforgeError):
    """An environment variable's value that cannot be used. Its message names the variable and what it
    takes; whatever was being opened when it was read (a checkpoint, a cache entry) is no part of it,
    so no caller adds its own file to the line or takes it for that file's fault."""


class BackendSettingError(BackendError, SettingError):
    """A backend's environment variable refused (still a BackendError to its callers)."""


class SpecSettingError(UnsupportedSpec, SettingError):
    """An environment variable refused where an UnsupportedSpec is what callers catch."""


class PluginSettingError(PluginError, SettingError):
    """An environment variable refused where a PluginError is what callers catch."""


class DataSettingError(DataError, SettingError):
    """An environment variable refused where a DataError is what callers catch."""


# module-level classes, not made on the fly: an MPI rank's refusal is pickled to the others by its class's name
_SETTING_KINDS: dict[type[HloforgeError], type[HloforgeError]] = {
    HloforgeError: SettingError, BackendError: BackendSettingError, UnsupportedSpec: SpecSettingError,
    PluginError: PluginSettingError, DataError: DataSettingError}


def setting_error(kind: type[HloforgeError], message: str) -> HloforgeError:
    """An error of `kind` marked as a SettingError (when it is one of the kinds above; another kind is
    raised as is): for a reader told which kind to raise (env_switch)."""
    if issubclass(kind, SettingError):
        return kind(message)
    return _SETTING_KINDS.get(kind, kind)(message)


def unreadable_text(e: OSError | UnicodeDecodeError) -> str:
    """Why a text file could not be read, in a user's words: the OS's reason without its errno, or the first byte
    that is not UTF-8 and where, not the codec's own sentence ("'utf-8' codec can't decode byte ...")."""
    if isinstance(e, UnicodeDecodeError):
        return f"byte 0x{e.object[e.start]:02x} at offset {e.start:,} is not UTF-8"
    return (e.strerror or str(e)).lower()
