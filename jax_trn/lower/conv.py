"""convolution: 1-D/2-D, strides, padding, dilation, groups, transposed forms (being written)."""
