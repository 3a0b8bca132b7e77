"""Tasks: what a label kind means to the trainer.

The loss's label kind picks the task (DESIGN: a dataset yields the label kind that picks the
loss): class ids → classification, per-pixel masks → segmentation, a dense float target the
shape of the output → diffusion (the noise ε a DDPM predicts). A task owns what the train step
is fed (`train_batch`: the feed's batch, turned into the step's inputs), the per-epoch
evaluation (a metrics dict for metrics.jsonl and one log line) and the metric the curves plot.

Without `--loss`, `default_loss` asks each task in `TASKS` order whether the net and dataset
are its own (a language model, per-token logits, keeps its own path in the trainer). A new
task — detection — is a `Task` subclass added to `TASKS` with its label kind.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import numpy as np

from hloforge.core.contracts import Dataset
from hloforge.core.errors import DataError, HloforgeError, UnsupportedSpec
from hloforge.core.hlo import FLOAT_DTYPES
from hloforge.core.modules import checked_label_spec
from hloforge.core.spec import Loss, NetSpec
from hloforge.datasets.stream import dataset_classes
from hloforge.train import diffusion, segmentation
from hloforge.train.metrics import check_finite, wilson

if TYPE_CHECKING:
    from hloforge.train.session import ForwardSession


@attrs.frozen
class Evaluation:
    metrics: dict[str, Any]  # what metrics.jsonl records, between the step fields and the throughput
    line: str  # the epoch log line's score part
    correct: np.ndarray | None = None  # classification's per-example bitmap (eval_correct.npz)
    loss: float | None = None  # the mean loss on the eval split where the task computes one (a Model's val_loss)


def loss_label_kind(loss: Loss, out_shape: tuple[int, ...]) -> str:
    """A loss's `label_kind`, or one read off its label spec: a class id, a mask, or a dense target."""
    kind = getattr(loss, "label_kind", Loss.label_kind)
    if kind:
        return str(kind)
    shape, dtype = checked_label_spec(loss, out_shape)
    if dtype == "i32" and shape == ():
        return "class"
    if dtype == "i32" and len(out_shape) == 3 and tuple(shape) == tuple(out_shape[1:]):
        return "mask"
    if dtype in FLOAT_DTYPES and tuple(shape) == tuple(out_shape):
        return "noise"
    raise UnsupportedSpec(f"loss {loss.name!r} takes labels {list(shape)} {dtype} on outputs {list(out_shape)}; "
                          f"no task trains with that (tasks: {sorted(TASKS)})")


def eval_chunks(run: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The eval split in the feed's order: streamed when the run streams, else in-memory chunks."""
    if run.feed.streams:
        yield from run.feed.eval_batches()
        return
    step = run.cfg.batch * 8
    for i in range(0, len(run.y_te), step):
        yield run.x_te[i:i + step], run.y_te[i:i + step]


def _weakly(run: Any) -> Any:
    """A proxy of `run` where it takes weak references (a Run does), else `run` itself (a stand-in)."""
    if isinstance(run, weakref.ProxyType):
        return run
    try:
        return weakref.proxy(run)
    except TypeError:
        return run


class Task:
    kind: ClassVar[str]  # the label kind this task trains with
    plot: ClassVar[tuple[str, str]]  # (metrics key, axis label) of the curves' right panel

    def __init__(self, run: Any):
        # A proxy, not the run itself: the run owns its task, and a task that owned its run made a cycle
        # that only Python's full collection frees, so every fit and evaluate of hf.Model (one run each)
        # kept its copy of x and the epoch's host state until then (~8 MB per mnist-mlp fit, 300 MB in a loop).
        self.run = _weakly(run)
        self.labels = self.check()  # the run assigns them (Run.__init__); a task never rewrites the run

    @classmethod
    def default_loss(cls, spec: NetSpec, data_cls: Any) -> str | None:
        """The loss this task trains `spec` on the dataset class with, when it is this task's pair."""
        raise NotImplementedError  # abstract

    def check(self) -> Any:
        """Refuse a dataset the net cannot train on, with one line. Returns the dataset the run feeds and
        scores from in place of its own (a detector's encoded targets), or None: the run's own."""
        return None

    def check_train(self, y: Any, n: int) -> None:
        """Refuse a registered dataset's train labels `y` (n rows, in memory) with one line before the compile,
        where this task can tell them wrong; a batch's are checked at its step either way."""

    @property
    def feed_shape(self) -> tuple[int, ...]:
        """The image shape the feed shapes the dataset's rows to."""
        shape: tuple[int, ...] = self.run.spec.input_shape
        return shape

    def fit_input(self, x: np.ndarray) -> np.ndarray:
        from hloforge.train.evaluation import fit_input

        return fit_input(x, self.run.spec, self.run.cfg.data, self.run.cfg.net)

    def train_batch(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The train step's (x, labels) from the feed's batch, at 1-based step `step`."""
        return x, y

    def evaluate(self, evaluator: ForwardSession, buffers: list[Any]) -> Evaluation:
        raise NotImplementedError  # abstract

    @staticmethod
    def scored_logits(evaluator: ForwardSession, buffers: list[Any], x: np.ndarray) -> np.ndarray:
        """The net's outputs on x, refused when not finite (argmax and the decoder would score NaN as a miss)."""
        out = evaluator.logits(x, buffers)
        check_finite(out, "eval outputs")
        return out

    def metric_names(self) -> set[str] | None:
        """The keys `evaluate` scores, known before anything is scored (a callback monitoring another is
        refused before the first step); None where they are not known ahead (checked at the epoch's end)."""
        return None

    def ema_metrics(self, ev: Evaluation) -> dict[str, Any]:
        """The EMA shadow's scores, as metrics.jsonl records them beside the live ones."""
        return {f"{k}_ema": v for k, v in ev.metrics.items() if k != "n"}


class ClassCountMismatch(DataError):
    """A classifier (or language model) whose head is not the dataset's class count; `stated`: the fact
    alone, without the advice the message adds (what import-weights says in its own words); `classes`: the
    dataset's count, for a command that advises another (0: not known)."""

    def __init__(self, message: str, stated: str = "", classes: int = 0):
        super().__init__(message)
        self.stated, self.classes = stated or message, classes


def classes_mismatch(data: str, data_classes: int, net: str, spec: NetSpec,
                     image: Sequence[int] | None = None) -> ClassCountMismatch:
    """The refusal of a head that is not the dataset's class count, saying what reshapes it (`net`: the name
    the config gives the net). `image`: the dataset's input shape where it states one; one the net cannot take
    is said in the same line, so the user fixes both at once rather than meeting the input's refusal next."""
    from hloforge.zoo import takes_classes

    said = f"dataset {data!r} has {data_classes} classes, net {spec.name!r} has {spec.num_classes}"
    if takes_classes(net):  # the flag, and the keyword a Model fit on the dataset takes
        flags, keywords, gives = f"--classes {data_classes}", f"classes={data_classes}", f"a head of {data_classes}"
        both, misfit = said, ""
        if image and int(np.prod(image)) != int(np.prod(spec.input_shape)):  # not a reshape fit_input makes
            from hloforge.train.evaluation import input_misfit

            shape = ",".join(map(str, image))
            both = (f"dataset {data!r} has {data_classes} classes and inputs of shape {list(image)}, net {spec.name!r} "
                    f"has {spec.num_classes} and takes {list(spec.input_shape)}")
            why = input_misfit(net, image)
            if why:  # the head's flag alone, and why the input's would not do
                misfit = f", but --input {shape} would not build it ({why}); expected data of a shape it takes"
            else:
                flags, keywords, gives = f"{flags} --input {shape}", f"{keywords}, input={tuple(image)}", \
                    f"{gives} and that input"
        return ClassCountMismatch(f"{both}; pass {flags} (hf.Model's {keywords}) to give the net {gives}{misfit}",
                                  said, data_classes)
    return ClassCountMismatch(f"{said}, a head it states itself (--classes does not reshape it): train a net of "
                              f"{data_classes} classes, e.g. a zoo net that takes --classes {data_classes} (hf.Model's "
                              f"classes={data_classes})", said, data_classes)


class ClassificationTask(Task):
    kind = "class"
    plot = ("top1", "test accuracy")

    @classmethod
    def default_loss(cls, spec: NetSpec, data_cls: Any) -> str | None:
        return "crossEntropy" if len(spec.out_shape) == 1 else None

    def check(self) -> None:
        run = self.run
        classes = dataset_classes(run.data)
        if classes != run.spec.num_classes:
            raise classes_mismatch(run.cfg.data, classes, run.cfg.net, run.spec, getattr(run.data, "image_shape", None))
        # before the first step, not at the first epoch's scoring (a column [N, 1] broke it, after an epoch)
        from hloforge.core.registry import component_label
        from hloforge.train.inputs import checked_labels

        checked_labels(run.y_te, (len(run.y_te),), "i32", classes, f"{component_label('dataset', run.data)} test split")
        # a folder of one class folder: loss 0 and top-1 100% whatever the net does (after the labels' check, which
        # says what labels 0 and 1 on a Keras yes/no head of one output need)
        if classes == 1:
            raise DataError(f"net {run.spec.name!r} on dataset {run.cfg.data!r} has 1 class: a classifier of one class "
                            "calls every example it (top-1 100%, its loss 0 whatever the weights), so it learns "
                            "nothing; expected at least 2 classes")

    def check_train(self, y: Any, n: int) -> None:
        # once: refused at the first bad batch, after the compile, naming no dataset
        from hloforge.core.registry import component_label
        from hloforge.train.inputs import checked_labels

        run = self.run
        checked_labels(y, (n,), "i32", run.spec.num_classes, f"{component_label('dataset', run.data)} train split")

    def evaluate(self, evaluator: ForwardSession, buffers: list[Any]) -> Evaluation:
        from hloforge.train.evaluation import evaluate, evaluate_stream

        run = self.run
        res = (evaluate_stream(evaluator, buffers, run.feed.eval_batches(), len(run.y_te)) if run.feed.streams
               else evaluate(evaluator, buffers, run.x_te, run.y_te))
        lo, hi = wilson(res.top1, res.n)
        metrics = {"top1": res.top1 / res.n, "top1_lo": lo, "top1_hi": hi,
                   **({} if res.top5 is None else {"top5": res.top5 / res.n}), "correct": res.top1, "n": res.n}
        return Evaluation(metrics, f"test {res.line()}", res.correct, res.nll)

    def metric_names(self) -> set[str] | None:
        from hloforge.train.evaluation import scores_top5

        return {"top1", "top1_lo", "top1_hi", "correct", "n"} | ({"top5"} if scores_top5(self.run.spec.num_classes)
                                                                 else set())

    def ema_metrics(self, ev: Evaluation) -> dict[str, Any]:
        return {"top1_ema": ev.metrics["top1"], "correct_ema": ev.metrics["correct"]}


class SegmentationTask(Task):
    """Per-pixel masks: mIoU, per-class IoU, pixel accuracy and region Dice (hloforge.train.segmentation)
    over the dataset's `regions` (each foreground class alone if it names none)."""

    kind = "mask"
    plot = ("miou", "test mIoU")

    @classmethod
    def default_loss(cls, spec: NetSpec, data_cls: Any) -> str | None:
        out = spec.out_shape
        masks = data_cls is None or getattr(data_cls, "label_kind", Dataset.label_kind) == "mask"  # None: the net alone
        return "perPixelCE" if len(out) == 3 and masks else None

    @property
    def regions(self) -> segmentation.Regions:
        data = self.run.data
        regions: segmentation.Regions = getattr(data, "regions", Dataset.regions) or \
            segmentation.default_regions(data.num_classes)
        return regions

    def check(self) -> None:
        run = self.run
        out = run.spec.out_shape
        if getattr(run.data, "label_kind", Dataset.label_kind) != "mask":
            raise DataError(f"net {run.spec.name!r} predicts per-pixel classes {list(out)}; dataset {run.cfg.data!r} "
                            "has no per-pixel masks")
        if dataset_classes(run.data) != out[0]:
            from hloforge.zoo import takes_classes

            n = run.data.num_classes  # a zoo segmenter's classes are its output's channels
            fix = (f"; pass --classes {n} (hf.Model's classes={n}) to give the net a head of {n}"
                   if takes_classes(run.cfg.net) else "")
            raise DataError(f"dataset {run.cfg.data!r} has {n} mask classes, net {run.spec.name!r} predicts "
                            f"{out[0]}{fix}")
        if tuple(run.y_te.shape[1:]) != tuple(out[1:]):
            raise DataError(f"dataset {run.cfg.data!r} gives masks of {list(run.y_te.shape[1:])}, net "
                            f"{run.spec.name!r} predicts {list(out[1:])}")
        segmentation.check_masks(run.y_te, run.data.num_classes, f"dataset {run.cfg.data!r} test split")
        segmentation.check_regions(self.regions, run.data.num_classes)

    def train_batch(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        # a label out of range would one-hot to nothing and train on a silently wrong target
        segmentation.check_masks(y, self.run.data.num_classes, f"dataset {self.run.cfg.data!r} train batch {step}")
        return x, y

    def evaluate(self, evaluator: ForwardSession, buffers: list[Any]) -> Evaluation:
        classes = self.run.data.num_classes
        confs = [segmentation.confusion_matrices(y, np.argmax(self.scored_logits(evaluator, buffers, x), axis=1),
                                                 classes) for x, y in eval_chunks(self.run)]
        n = sum(len(c) for c in confs)
        if n != len(self.run.y_te):
            raise DataError(f"the eval pass scored {n} images; the eval split has {len(self.run.y_te)}")
        m = segmentation.scores(np.concatenate(confs), self.regions)
        dice = "  ".join(f"{k} {m[f'dice/{k}']:.3f}" for k in self.regions)
        line = f"test mIoU {m['miou']:.4f}  pixel acc {100 * m['pixel_acc']:.2f}%  Dice {dice}"
        return Evaluation({**m, "n": n}, line)

    def metric_names(self) -> set[str] | None:
        return {*segmentation.score_names(self.run.data.num_classes, self.regions), "n"}


class DiffusionTask(Task):
    """A DDPM: the feed's clean images x0 become (x_t with the time channel, ε) on the host, per
    step from (seed, step); eval is the mean noise MSE over the test split at fixed seeded t and ε
    (hloforge.train.diffusion)."""

    kind = "noise"
    plot = ("noise_mse", "test noise MSE")

    @property
    def schedule(self) -> diffusion.LinearSchedule:
        """The run's own β schedule (its config; an older run's, without one, the documented default)."""
        return diffusion.LinearSchedule.of(self.run.cfg)

    @classmethod
    def default_loss(cls, spec: NetSpec, data_cls: Any) -> str | None:
        return "mse" if diffusion.is_time_conditioned(spec) else None

    @staticmethod
    def ddpm_shaped(spec: NetSpec) -> bool:
        """Whether the net maps images plus the time channel [C + 1, ...] to their noise [C, ...]."""
        out = tuple(spec.out_shape)
        return bool(out) and tuple(spec.input_shape) == (out[0] + 1, *out[1:])

    def check(self) -> None:
        run = self.run
        self.schedule  # noqa: B018 — refuse an impossible schedule before anything trains with it
        out = tuple(run.spec.out_shape)
        image = tuple(getattr(run.data, "image_shape", Dataset.image_shape) or ())
        if image != out or not self.ddpm_shaped(run.spec):
            raise DataError(f"a DDPM on {out[0]}-channel images {list(out[1:])} takes input "
                            f"{[out[0] + 1, *out[1:]]} (the images and the time channel) and predicts {list(out)}; "
                            f"net {run.spec.name!r} takes {list(run.spec.input_shape)}, dataset {run.cfg.data!r} "
                            f"gives {list(image)}")

    @property
    def feed_shape(self) -> tuple[int, ...]:
        shape: tuple[int, ...] = self.run.spec.out_shape
        return shape

    def fit_input(self, x: np.ndarray) -> np.ndarray:
        return x

    def train_batch(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.run.cfg.seed, diffusion.TRAIN_STREAM, step])
        return diffusion.training_pair(x, rng, self.schedule)

    def evaluate(self, evaluator: ForwardSession, buffers: list[Any]) -> Evaluation:
        x0 = np.concatenate([x for x, _ in eval_chunks(self.run)])
        xin, eps = diffusion.eval_pair(x0, self.schedule)
        mse = float(np.mean((evaluator.logits(xin, buffers).astype(np.float64) - eps) ** 2))
        return Evaluation({"noise_mse": mse, "n": len(x0)},
                          f"test noise MSE {mse:.4f} ({len(x0)} images, fixed timesteps)")

    def metric_names(self) -> set[str] | None:
        return {"noise_mse", "n"}


class DetectionTask(Task):
    """Boxes: the net's head (yolov1Head, fpnDetect) says how the dataset's boxes (`boxes(split)`,
    rows (class, x0, y0, x1, y1) in pixels) become the loss's targets, encoded once per split;
    eval is mAP@0.5 on the test split after decoding and per-class NMS (hloforge.train.detection)."""

    kind = "boxes"
    plot = ("map50", "test mAP@0.5")

    @classmethod
    def default_loss(cls, spec: NetSpec, data_cls: Any) -> str | None:
        from hloforge.train.detection import DetectionHead

        try:
            return DetectionHead.of(spec).loss
        except UnsupportedSpec:
            return None

    def check(self) -> Any:
        from hloforge.core.registry import default_registry
        from hloforge.train.detection import DetectionHead, DetectionLabels

        run = self.run
        self.head = DetectionHead.of(run.spec)
        if not hasattr(run.data, "boxes"):
            raise DataError(f"net {run.spec.name!r} is a detector; dataset {run.cfg.data!r} has no boxes")
        if run.cfg.workers:
            raise DataError("a detector's targets are encoded in process from the dataset's boxes: use --workers 0")
        image = tuple(getattr(run.data, "image_shape", Dataset.image_shape) or run.spec.input_shape)
        if image != tuple(run.spec.input_shape):
            raise DataError(f"dataset {run.cfg.data!r} gives images {list(image)}, detector {run.spec.name!r} takes "
                            f"{list(run.spec.input_shape)}; a zoo net takes --input {','.join(map(str, image))}")
        boxes, head_boxes = getattr(run.variant.make_loss(default_registry()), "boxes", None), \
            getattr(self.head.layer, "boxes", None)
        if boxes != head_boxes:  # the yolov1 loss reads the head's per-cell layout with its own `boxes`
            raise DataError(f"loss {run.variant.loss!r} reads {boxes} box(es) per cell, net {run.spec.name!r}'s head "
                            f"has {head_boxes}")
        self.truth = run.data.boxes("test")
        if not any(len(np.asarray(g).reshape(-1, 5)) for g in self.truth):  # mAP is undefined without any
            raise DataError(f"dataset {run.cfg.data!r}: its test split holds no ground-truth box in any of its "
                            f"{len(self.truth)} images, so mAP cannot score the run; label some test images")
        # The feed and the eval read the encoded targets in place of the dataset's own labels.
        return DetectionLabels(run.data, self.head)

    def evaluate(self, evaluator: ForwardSession, buffers: list[Any]) -> Evaluation:
        from hloforge.train.detection import mean_ap

        dets = [d for x, _ in eval_chunks(self.run)
                for d in self.head.decode(self.scored_logits(evaluator, buffers, x))]
        res = mean_ap(dets, self.truth)
        metrics = {"map50": res.map, **{f"ap50/{c}": v for c, v in res.ap.items()}, "n": res.n_images}
        return Evaluation(metrics, f"test {res.line()}")

    def metric_names(self) -> set[str] | None:  # mean_ap scores the classes the truth holds
        truth = {int(c) for g in self.truth for c in np.asarray(g, np.float64).reshape(-1, 5)[:, 0]}
        return {"map50", "n", *(f"ap50/{c}" for c in truth)}


# In the order default_loss asks them: a time-conditioned net is a DDPM even on a dataset with masks,
# and a detection head's grid [C, g, g] is not a per-pixel map.
TASKS: dict[str, type[Task]] = {t.kind: t for t in (DiffusionTask, DetectionTask, SegmentationTask,
                                                     ClassificationTask)}


def default_loss(spec: NetSpec, data: str | None) -> str:
    """The loss a net trains with on a dataset (by name) when none is asked for; `data` None: the
    net's own, read off its output alone (what `hloforge render` builds without --data)."""
    if len(spec.out_shape) == 2:
        return "tokenCrossEntropy"  # per-token logits: a language model
    from hloforge.core.registry import default_registry

    data_cls = None if data is None else default_registry().get("dataset", data)
    for task in TASKS.values():
        loss = task.default_loss(spec, data_cls)
        if loss:
            return loss
    on = f" on dataset {data!r}" if data is not None else ""
    raise UnsupportedSpec(f"no task trains net {spec.name!r} (output {list(spec.out_shape)}){on} by "
                          "default; pass --loss")


# What the net's one output is to a reader of its forward (`hloforge export`'s manifest), by its loss's label kind
_OUTPUT_SAID = {"class": "logits over the {classes} classes (argmax: the class; softmax: its probability)",
                "mask": "per-pixel logits over the {classes} mask classes, channels first (argmax: the mask)",
                "noise": "the noise the DDPM predicts in its input x_t (the input's last channel: t)",
                "boxes": "the detection head's raw output, decoded to boxes as its head ({head}) decodes it",
                "tokens": "next-token logits over the {classes}-character vocabulary at each position"}


def output_said(spec: NetSpec, task: Task | None) -> dict[str, str]:
    """The net's output as the run trained it (`task`: the run's, None for a language model's): the label kind
    its loss takes, and what the output means."""
    kind = "tokens" if task is None else task.kind
    head = spec.layers[-1].kind if spec.layers else ""
    return {"kind": kind, "meaning": _OUTPUT_SAID.get(kind, "").format(classes=spec.num_classes, head=head)}


_LABELS_SAID = {"class": "integer class indices", "mask": "integer per-pixel class masks",
                "noise": "float targets", "boxes": "boxes", "tokens": "next-token ids"}


def _shape_said(shape: Sequence[int]) -> str:
    return "[" + ", ".join(["N", *map(str, shape)]) + "]"


def losses_for(spec: NetSpec, data_kind: str) -> list[str]:
    """The registered losses that train `spec` on labels of `data_kind` (each with its default options)."""
    from hloforge.core.registry import default_registry

    reg, out, fit = default_registry(), tuple(spec.out_shape), []
    for name in reg.names("loss"):
        try:
            loss = reg.make("loss", name)
            loss.check(out)
            kind = loss_label_kind(loss, out)
        except Exception:  # a plugin loss that needs options, or refuses this output: not a fit
            continue
        if kind == data_kind and (kind != "noise" or DiffusionTask.ddpm_shaped(spec)):
            fit.append(name)
    return fit


def _builtin_loss(name: str) -> bool:
    from hloforge.core.registry import default_registry

    try:
        return bool(default_registry().entry("loss", name).builtin)
    except HloforgeError:  # a loss not registered by that name: not one of ours
        return False


def check_loss_fits(spec: NetSpec, loss: Loss, data: str | None = None) -> None:
    """`loss.check` of the net's output, its refusal ("crossEntropy takes logits [classes]" to a segmenter) naming
    the loss the net trains with by default on dataset `data` (None: on arrays, the net's own task's)."""
    from hloforge.train.detection import HEAD_KINDS

    head = spec.walk()[-1].layer if spec.layers else None
    own = HEAD_KINDS.get(getattr(head, "head_kind", None) or "")
    # hloforge's losses each read one output's layout: another's on a detection head (anchorYolo reading fpnDetect's
    # [cells, A, 5 + C] as channels over a grid) trained and scored a plausible run of nothing it meant; a plugin's
    # loss may read any
    if own and loss.name != own and _builtin_loss(loss.name):
        raise DataError(f"loss {loss.name!r} does not read the output of net {spec.name!r}'s head "
                        f"({getattr(head, 'kind', 'detection')}); expected {own}, its own (the default, with no loss "
                        "given)")
    try:
        loss.check(tuple(spec.out_shape))
    except UnsupportedSpec as e:
        try:
            own = default_loss(spec, data)
        except HloforgeError:  # a net no task trains by default: no loss to name
            raise e from None
        on = f" on dataset {data!r}" if data else ""
        raise UnsupportedSpec(f"{e}; net {spec.name!r}{on} trains with {own} (its default, with no loss given)") \
            from None


def misfit(spec: NetSpec, loss: Loss, kind: str, data: str, data_kind: str, y: Any) -> str | None:
    """One line when the loss's labels are not what dataset `data` gives (`data_kind`, its labels `y` if known)
    or the net is not the loss's task's (mse on a classifier: its float targets train a DDPM); None when they
    fit. The task's own check then names any finer mismatch (a DDPM's image size, a class count)."""
    out = tuple(spec.out_shape)
    shape, dtype = checked_label_spec(loss, out)
    if kind == "noise" and not DiffusionTask.ddpm_shaped(spec):
        wants = (f"float targets shaped like the net's output ({_shape_said(shape)}) and trains only a DDPM (images "
                 f"plus a time channel [C + 1, ...] to their noise [C, ...]), which a net from "
                 f"{list(spec.input_shape)} to {list(out)} is not")
    elif kind == "class" and data_kind != "class":
        wants = f"{_LABELS_SAID['class'] if dtype == 'i32' else 'class targets'} of shape {_shape_said(shape)}"
    else:
        return None
    labels = _LABELS_SAID.get(data_kind, f"{data_kind!r} labels")
    if y is not None:
        labels += f" of shape {_shape_said(np.shape(y)[1:])}"
    fit = [n for n in losses_for(spec, data_kind) if n != loss.name]
    fits = (f"losses that fit: {', '.join(fit)}" if fit else
            f"no registered loss trains net {spec.name!r} (output {list(out)}) on these labels")
    return (f"loss {loss.name!r} does not fit net {spec.name!r} on dataset {data!r}: the dataset gives "
            f"{labels}; {loss.name} wants {wants}; {fits}")


def make_task(run: Any) -> Task:
    """The task of the run's loss (its label kind), checked against the net and the dataset."""
    from hloforge.core.registry import default_registry

    loss = run.variant.make_loss(default_registry())
    out = run.spec.out_shape
    data_kind = str(getattr(run.data, "label_kind", Dataset.label_kind))
    check_loss_fits(run.spec, loss, run.cfg.data)
    kind = loss_label_kind(loss, out)
    if kind not in TASKS:
        raise UnsupportedSpec(f"loss {loss.name!r} takes {kind!r} labels; no task trains with those "
                              f"(tasks: {sorted(TASKS)})")
    why = misfit(run.spec, loss, kind, run.cfg.data, data_kind, getattr(run, "y_te", None))
    if why:  # before the task's own check, which would speak of the wrong task (a DDPM's shapes for mse)
        raise DataError(why)
    return TASKS[kind](run)
