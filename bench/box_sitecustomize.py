"""The sitecustomize the GPU box's SGLang installs get (bench/sglang_live.sh, pov.sh, kimi_live.sh copy it to
/tmp/sglsite/sitecustomize.py): transformers 5.17 already registers ``qwen3_asr`` and sglang 0.5.17 registers
it again, which raises; the registration is made to accept an existing entry."""

try:
    from transformers import AutoConfig

    _register = AutoConfig.register
    AutoConfig.register = staticmethod(lambda *a, exist_ok=False, **k: _register(*a, exist_ok=True, **k))
except Exception as e:  # a box without transformers still starts Python
    print("sitecustomize:", e)
