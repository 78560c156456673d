"""Starting local servers so that they start every time: ports outside the kernel's ephemeral range, a
startup timeout that suits a loaded machine, a few tries on new ports, and one line saying why at the end.

It imports nothing of ours, so the demo, ``db/embedded.py``, ``testbed/``, the soak and the benchmarks can
all use it without crossing a layer.
"""
