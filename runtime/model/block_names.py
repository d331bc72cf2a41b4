"""The names the block layers (block_linear.py) take, in a module that imports nothing heavy: scripts check a user's
`--kinds` or `--modes` against them before torch loads, so a bad one is refused at once."""

from __future__ import annotations

# The kinds the kernels take; the kernels' KIND_* values are ggml's type ids (runtime/native/ggml_blocks.h).
KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# The activations modes (block_linear.py's docstring says what each does).
ACTIVATIONS = ("int16-decode", "float", "int16", "int8", "int8-decode", "auto")
