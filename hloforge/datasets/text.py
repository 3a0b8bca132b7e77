"""`text`: character-level language modelling on any UTF-8 file (`--data text --data-file PATH`).

The embedded default corpus is the Python standard library's `pydoc_data.topics` (the help
topics, every topic's text in sorted key order joined by blank lines: 465,126 characters on
Python 3.11.7, a few more or fewer on other patch releases), so training works on any machine with
no download.

* Split by position: the first 90% of the characters train, the last 10% validate.
* Vocabulary (`vocab` = 65 by default, tinygpt-nano's): the `vocab − 1` most frequent characters
  of the training split (ties by code point), numbered in code-point order, plus one "other"
  token (the last id) for every rarer character; it prints as U+FFFD. On the default corpus
  the other token covers 0.55% of characters. The vocabulary size is fixed whatever the file,
  so a net's head always fits; unused ids simply never occur.
* Examples are windows of `seq_len` ids (the net's input, as f32) with the next-character ids as
  labels [seq_len] (int32). Training windows tile the training split without overlap. The
  validation windows tile the validation split so that every validation character after the
  first is a target exactly once; the last window is padded at its end and its padded targets
  are −1 (ignored). A causal model's logits at real positions do not depend on the padding.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError, unreadable_text
from hloforge.core.hookspecs import hookimpl
from hloforge.datasets.options import integer, path

VAL_FRACTION = 0.1
OTHER = "\ufffd"
IGNORE = -1


def default_corpus() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def _enough(chars: int, seq_len: int) -> bool:
    """Whether a corpus of `chars` characters gives a training window and a validation target."""
    cut = int(chars * (1.0 - VAL_FRACTION))
    return cut >= seq_len + 1 and chars - cut >= 2


class Text(Dataset):
    name = "text"
    splits = ("train", "test")
    label_kind = "tokens"

    def __init__(self, data_file: str = "", seq_len: int = 64, vocab: int = 65):
        seq_len, vocab = integer("text", "seq_len", seq_len, 1), integer("text", "vocab", vocab, 2)
        data_file = path("text", "data_file", data_file)
        if data_file:
            try:
                with open(data_file, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is no character
                    text = f.read()
            except OSError as e:  # no such file, a directory, no permission: not a matter of its encoding
                raise DataError(f"text: {data_file}: {(e.strerror or str(e)).lower()}; expected a UTF-8 text file "
                                "(--data-file)") from None
            except UnicodeDecodeError as e:
                raise DataError(f"text: cannot read {data_file} as UTF-8 ({unreadable_text(e)})") from None
        else:
            text = default_corpus()
        self.source = data_file or "pydoc_data.topics"
        if not _enough(len(text), seq_len):
            need = next(n for n in itertools.count(max(0, int((seq_len + 1) / (1.0 - VAL_FRACTION)) - 2))
                        if _enough(n, seq_len))  # from just below the closed form: a few steps
            raise DataError(f"text: {self.source} has {len(text)} characters, too few for seq_len {seq_len}: expected "
                            f"at least {need} (one training window of {seq_len} and its next character in the first "
                            f"{1 - VAL_FRACTION:.0%}, two characters to validate in the rest)")
        cut = int(len(text) * (1.0 - VAL_FRACTION))
        counts = collections.Counter(text[:cut])
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab - 1]
        self.chars = sorted(c for c, _ in top) + [OTHER]
        self._index = {c: i for i, c in enumerate(self.chars[:-1])}
        self.num_classes = vocab
        self.seq_len = seq_len
        ids = self.encode(text)
        self.train_ids, self.val_ids = ids[:cut], ids[cut:]
        self._data = {"train": self._train_windows(), "test": self._val_windows()}

    # ------------------------------------------------------------------ the vocabulary
    def encode(self, s: str) -> np.ndarray:
        other = self.num_classes - 1
        return np.fromiter((self._index.get(c, other) for c in s), np.int32, len(s))

    def unknown(self, s: str) -> list[str]:
        """The characters of `s` outside the vocabulary (each encoded as the other-character token), sorted."""
        return sorted(set(s) - set(self._index))

    @property
    def vocabulary(self) -> list[str]:
        """Each id's character, ids 0..vocab − 1, as encode and decode read them: a corpus of fewer characters leaves
        ids unused between its last character and the other-character token (the last id), each U+FFFD."""
        return [*self.chars[:-1], *[OTHER] * (self.num_classes - len(self.chars) + 1)]

    def decode(self, ids: np.ndarray) -> str:
        return "".join(self.chars[min(int(i), len(self.chars) - 1)] for i in ids)

    # ------------------------------------------------------------------ windows
    def _train_windows(self) -> tuple[np.ndarray, np.ndarray]:
        t, ids = self.seq_len, self.train_ids
        n = (len(ids) - 1) // t
        x = ids[:n * t].reshape(n, t)
        y = ids[1:n * t + 1].reshape(n, t)
        return x.astype(np.float32), y.astype(np.int32)

    def _val_windows(self) -> tuple[np.ndarray, np.ndarray]:
        t, ids = self.seq_len, self.val_ids
        n = math.ceil((len(ids) - 1) / t)
        x = np.zeros((n, t), np.float32)
        y = np.full((n, t), IGNORE, np.int32)
        for w in range(n):
            s = w * t
            m = min(t, len(ids) - 1 - s)
            x[w, :m] = ids[s:s + m]
            y[w, :m] = ids[s + 1:s + m + 1]
        return x, y

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._data:
            raise DataError(f"text has no split {split!r}; expected one of {list(self._data)}")
        return self._data[split]

    # ------------------------------------------------------------------ the baseline
    def bigram_bits(self, alpha: float = 0.1) -> float:
        """Bits per character on the validation targets of a character bigram model fitted on the
        training split (add-`alpha` smoothing), scored on exactly the targets the net is scored on."""
        v = self.num_classes
        counts = np.full((v, v), alpha, np.float64)
        np.add.at(counts, (self.train_ids[:-1], self.train_ids[1:]), 1.0)
        logp = np.log(counts / counts.sum(axis=1, keepdims=True))
        prev, nxt = self.val_ids[:-1], self.val_ids[1:]
        return float(-logp[prev, nxt].mean() / math.log(2))


def bits_per_char(logits: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """(bits per character, number of targets) over every target of y ≥ 0; logits [n, T, V]."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    keep = y >= 0
    nll = -np.take_along_axis(logp, np.where(keep, y, 0)[..., None], axis=-1)[..., 0]
    count = int(keep.sum())
    return float(nll[keep].sum() / count / math.log(2)), count


@hookimpl
def hloforge_datasets() -> list[type]:
    return [Text]
