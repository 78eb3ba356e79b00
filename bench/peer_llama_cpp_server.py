"""Start llama-cpp-python's own server (`python -m llama_cpp.server`) for a side-by-side run.

One change, the same one kvserve makes: model weights in plain CPU buffers
(use_extra_bufts off). On this machine llama.cpp's AMX matmul segfaults on any batch of
more than one token, so the peer would otherwise crash on its first prompt.
Arguments are passed to llama_cpp.server unchanged.
"""

from __future__ import annotations

import llama_cpp
import llama_cpp.llama_cpp as low

_default_params = low.llama_model_default_params


def _params_without_extra_buffers():  # type: ignore[no-untyped-def]
    params = _default_params()
    params.use_extra_bufts = False
    return params


llama_cpp.llama_model_default_params = _params_without_extra_buffers
low.llama_model_default_params = _params_without_extra_buffers

if __name__ == "__main__":
    from llama_cpp.server.__main__ import main

    main()
