"""convolution on TensorE: one matmul per kernel tap (or tap group), accumulated in PSUM.

For every output image and output-channel tile, each kernel tap t = (kh, kw) is a
TensorE matmul over input channels (the contraction, on partitions, §2.2):

    psum[co, f] (+)= W[ci, t, co].T @ X[ci, f + offset(t)]

where the moving operand is a *contiguous* run of the input held in SBUF. That works
because the input sits in SBUF in a layout where every tap is a constant shift of a
flat index ("wide" output grid): rows of the padded, dilated input of width Qw, output
position (oh, ow) at flat index oh * Qw + ow, tap (kh, kw) at + kh * Qw + kw. The
Qw - OW columns past each output row are computed and dropped when PSUM is evacuated.
A stride s splits the input into s x s phases (polyphase): tap k reads phase
(k * rd) % s shifted by (k * rd) // s, so strided taps are contiguous runs too.

The input (`_source`) is read in place, band by band, its rows DMAed in (channel-minor
NHWC rows by dma_transpose when no cast is needed, §3.4; else from a channel-major
copy made by relayout), then
- stride 1 without lhs dilation (`Padded`): copied row by row past the zero columns
  of the padding (set once per buffer; pad rows memset per band);
- a stride or lhs dilation (`Phased`, 1-D/2-D): each row transposed on TensorE and
  multiplied by a 0/1 selection matrix that scatters it into its padded phase rows;
- otherwise (3-D strided, phase rows wider than a PSUM bank: `Staged`): a DMA kernel
  first writes an HBM temporary [N, C, phases..., Q...] in the matmul dtype,
  zero-filled where padding or lhs dilation leaves holes, the input copied in with
  strided access patterns (slow: 2-4 byte DMA runs).

The weights stay resident per group block: read directly (HWIO: rows of co; OIHW: a
dma_transpose of [co, ci] per tap) or, for grouped convs with small groups (depthwise)
packed block-diagonally into 128 partitions (one matmul serves many groups), staged
as [ci, taps, co] blocks by a DMA kernel.

Tap packing (`Packing`): when input channels fill <= 64 partitions, R copies of the
band, shifted by the offsets of R consecutive taps, fill R * ct partitions (SBUF ->
SBUF DMA), so one matmul contracts over R taps at once (3 -> 64 channels, 3x3: one
matmul instead of nine; 64 -> 64: six instead of nine).

The conv kernel: per band of output rows the input band is loaded (triple-buffered,
band k + 1 emitted before band k's matmuls so its padding copies overlap them), split
in chunks of at most 512 flat positions (one PSUM bank of FP32, §3.2); per chunk the
(ci tile, tap group) matmuls accumulate into one bank, VectorE/ScalarE copy the valid
columns of each output row to SBUF in the result dtype, and one DMA per band writes
the rows out (a DMA has a fixed cost of ~2 us, §2.6). A channel-minor output (NHWC)
is written channel-major to a temporary and swapped into place on TensorE.

Transposed convolutions (lhs dilation) and the input gradient (lhs dilation +
padding) are the same conv with other attributes. The weight gradient (batch and
feature dims swapped by dimension_numbers, the forward output as a large kernel
window, the forward stride as rhs dilation) contracts over the window instead
(wgrad.py) when the window is >= 16x the output; otherwise (grouped: batch
groups) the tap loop runs it, contracting over the batch with tap packing.
batch_group_count splits the batch: output-channel group b reads input images
b * N / B + n. Precision follows dot_general (dot.py `matmul_types`).
"""
from __future__ import annotations

from . import rule as _rule  # noqa: F401  (registers the `convolution` rule)
