"""The one native piece: the SSE reader's hot path in C (locustfiles/request/_ssefast.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no
compiler), the install goes on and the SSE reader runs its Python code (sse.py), which the
tests hold to the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "locustfiles.request._ssefast",
            ["locustfiles/request/_ssefast.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
