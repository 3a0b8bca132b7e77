"""resnet18-cifar's convolutions one at a time: the forms hloforge emits for XLA against PyTorch's
own kernels (oneDNN), forward, ∂x and ∂w apart, in one process.

    python benchmarks/conv_kernels.py [--batch 32] [--rounds 15]

Each row is one distinct conv of the net (× how often it occurs). "hf" is the module XLA compiles
for that part alone, in the form the XLA backend's strategy defaults pick (`nhwc_conv2d`, the
chunked ∂w, the im2col GEMM where the kernel outweighs the input); "torch" is
`aten.convolution_backward` / `conv2d` on NCHW tensors (what the bench's torch peer runs), and
"torch cl" the same on channels-last tensors. The totals weight each row by its count and leave
out the stem's ∂x (no train step computes it): the time the net's convolutions alone take, with
nothing else of the step around them.

Each peer runs its rounds of a part back to back, not alternating with the others: torch's OpenMP
threads spin for a while after each op, and an XLA run started then shares the two cores with
them (alternating call by call put hloforge's total at 1050.7 ms against 798.8 with
OMP_WAIT_POLICY=PASSIVE, torch's at 669.1 against 660.9).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from hloforge.core import autodiff
from hloforge.core.hlo import Builder
from hloforge.lowering import conv
from hloforge.train.autotune import Candidate, runner_on
from hloforge.train.session import make_backend

# (count, in channels, out channels, input size, kernel, stride): resnet18-cifar's convolutions
CONVS = [(1, 3, 64, 32, 3, 1), (4, 64, 64, 32, 3, 1),
         (1, 64, 128, 32, 3, 2), (1, 64, 128, 32, 1, 2), (3, 128, 128, 16, 3, 1),
         (1, 128, 256, 16, 3, 2), (1, 128, 256, 16, 1, 2), (3, 256, 256, 8, 3, 1),
         (1, 256, 512, 8, 3, 2), (1, 256, 512, 8, 1, 2), (3, 512, 512, 4, 3, 1)]
PARTS = ("fwd", "dx", "dw")


def hf_module(part: str, n: int, c: int, o: int, h: int, k: int, s: int) -> str:
    p = k // 2
    oh = conv.window_out(h, k, s, (p, p))
    b = Builder("f32", f"conv_{part}", "xla")
    x, w, g = b.arg((n, h, h, c)), b.arg((k, k, c, o)), b.arg((n, oh, oh, o))
    y = conv.nhwc_conv2d(b, x, w, stride=s, pads=[(p, p), (p, p)])
    outs = [y] if part == "fwd" else autodiff.grad(b, [y], [g], [x if part == "dx" else w])
    return b.module(outs)


def torch_runs(n: int, c: int, o: int, h: int, k: int, s: int, channels_last: bool) -> dict[str, Callable[[], Any]]:
    import torch

    p = k // 2
    oh = conv.window_out(h, k, s, (p, p))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, h).contiguous(memory_format=fmt)
    w = torch.randn(o, c, k, k).contiguous(memory_format=fmt)
    g = torch.randn(n, o, oh, oh).contiguous(memory_format=fmt)
    back = torch.ops.aten.convolution_backward

    def grad(mask: list[bool]) -> Callable[[], Any]:
        return lambda: back(g, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask)

    return {"fwd": lambda: torch.conv2d(x, w, stride=s, padding=p),
            "dx": grad([True, False, False]), "dw": grad([False, True, False])}


def timed(fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return run


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    import torch

    torch.manual_seed(0)
    prepare = runner_on(make_backend("xla"))
    peers = ("hf", "torch", "torch cl")
    totals = {(peer, part): 0.0 for peer in peers for part in PARTS}
    head = f"conv (batch {args.batch})"
    print(f"{head:24} {'part':4} " + " ".join(f"{p:>9}" for p in peers) + "   ms")
    for count, c, o, h, k, s in CONVS:
        shape = (args.batch, c, o, h, k, s)
        tn, tc = torch_runs(*shape, channels_last=False), torch_runs(*shape, channels_last=True)
        with torch.no_grad():
            for part in PARTS:
                if part == "dx" and c == 3:
                    continue
                runs = {"hf": prepare(Candidate(((part, part),), hf_module(part, *shape))),
                        "torch": timed(tn[part]), "torch cl": timed(tc[part])}
                med = {}
                for peer, r in runs.items():  # one peer's rounds together: see the docstring
                    for _ in range(2):
                        r()
                    med[peer] = statistics.median(r() * 1e3 for _ in range(args.rounds))
                for p in peers:
                    totals[p, part] += count * med[p]
                label = f"{c}->{o} {k}x{k}/{s} at {h}² ×{count}"
                print(f"{label:24} {part:4} " + " ".join(f"{med[p]:9.2f}" for p in peers), flush=True)
    for part in (*PARTS, "all"):
        tot = {p: sum(totals[p, q] for q in PARTS) if part == "all" else totals[p, part] for p in peers}
        print(f"{'total':24} {part:4} " + " ".join(f"{tot[p]:9.1f}" for p in peers)
              + f"   hf / torch {tot['hf'] / tot['torch']:.2f}, hf / torch cl {tot['hf'] / tot['torch cl']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
