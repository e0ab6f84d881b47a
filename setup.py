"""Builds the optional native codec kernels; everything else is in pyproject.toml.

The extension is optional: without a C compiler ddctl falls back to the torch
reference codecs (same bytes, slower), so installation never fails for it.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ddctl_agents._kernels",
            sources=[
                "agents/ddctl_agents/native/kernels.c",
                "agents/ddctl_agents/native/fused.c",
                "agents/ddctl_agents/native/step.c",
                "agents/ddctl_agents/native/crc32.c",
            ],
            depends=["agents/ddctl_agents/native/common.h", "agents/ddctl_agents/native/packed.h"],
            extra_compile_args=["-O3", "-std=c11", "-fno-math-errno", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
