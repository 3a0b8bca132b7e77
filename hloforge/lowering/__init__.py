"""The alternative forms a layer's ops take per render target, apart from the layers' math.

Each module holds the forms of one family and the strategy kinds that pick among them
(core/strategy.py): conv.py (NCHW/NHWC, the written / chunked / winograd / autodiff backward, im2col
GEMM, ∂x on flipped activations, depthwise shifted products and phases, pointwise GEMM), winograd.py
(Winograd's F(2×2, 3×3), the winograd backward's), norm.py (the normaliser: two-pass, blocked,
fused; layer norm's sums), pool.py (max pooling: slices, select, window), attention.py (dense SDPA,
FlashAttention, sdpaGrad) and dense.py (a weight's product with tokens). A layer plugin calls into
them and lists the kinds in its `hloforge_strategy_kinds` hook; a backend picks its choices in
`strategy_defaults`; the gate runs every layer case once per choice. It imports only the core.
"""
