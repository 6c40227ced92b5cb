"""The optional C core of the planner's local search (everything else is in pyproject.toml).

``optional=True``: without a C compiler the install still succeeds and the planner uses
its Python code (h3flow/planner/fastseq.py says which one runs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "h3flow.planner._fastseq",
            ["h3flow/planner/_fastseq.c"],
            optional=True,
            extra_compile_args=["-O2", "-ffp-contract=off"],  # no fused multiply-add: the same sums as Python's
        )
    ]
)
